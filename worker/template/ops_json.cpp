// Implementation of the JSON half of worker/template/ops.hpp: from_json (request context ->
// Value, depth-bounded) and to_json (Python json.dumps as transformers' tojson filter calls
// it: ensure_ascii, indent, separators, sort_keys).
#include "worker/template/ops.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "worker/template/ops_internal.hpp"

namespace servedeck::worker::tmpl {

using detail::type_name;

namespace {

void json_string(std::string& out, std::string_view s, bool ensure_ascii) {
  out.push_back('"');
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    char buf[16];
    switch (c) {
      case '"': out += "\\\""; ++i; continue;
      case '\\': out += "\\\\"; ++i; continue;
      case '\n': out += "\\n"; ++i; continue;
      case '\r': out += "\\r"; ++i; continue;
      case '\t': out += "\\t"; ++i; continue;
      case '\b': out += "\\b"; ++i; continue;
      case '\f': out += "\\f"; ++i; continue;
      default: break;
    }
    if (c < 0x20 || (ensure_ascii && c == 0x7F)) {
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
      ++i;
      continue;
    }
    if (c < 0x80 || !ensure_ascii) {
      out.push_back(static_cast<char>(c));
      ++i;
      continue;
    }
    // ensure_ascii: decode the code point and write \uXXXX (surrogate pair above U+FFFF).
    const auto offs = utf8_offsets(s.substr(i, 4));
    const size_t len = offs.size() > 1 ? offs[1] : 1;
    uint32_t cp = c;
    if (len > 1) {
      cp = c & (len == 2 ? 0x1F : len == 3 ? 0x0F : 0x07);
      for (size_t k = 1; k < len; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
    }
    if (cp >= 0x10000) {
      const uint32_t v = cp - 0x10000;
      std::snprintf(buf, sizeof buf, "\\u%04x\\u%04x", 0xD800 + (v >> 10), 0xDC00 + (v & 0x3FF));
    } else {
      std::snprintf(buf, sizeof buf, "\\u%04x", cp);
    }
    out += buf;
    i += len;
  }
  out.push_back('"');
}

void json_dump(std::string& out, const Value& v, const JsonOptions& o, int depth) {
  if (depth > 200) throw EvalError("tojson: value nested deeper than 200 levels (or circular)");
  const std::string item_sep = o.separators ? o.separators->first : (o.indent ? "," : ", ");
  const std::string key_sep = o.separators ? o.separators->second : ": ";
  auto newline = [&](int level) {
    if (!o.indent) return;
    out.push_back('\n');
    for (int i = 0; i < level; ++i) out += *o.indent;
  };
  switch (v.kind()) {
    case Kind::none: out += "null"; return;
    case Kind::boolean: out += v.as_bool() ? "true" : "false"; return;
    case Kind::integer: out += std::to_string(v.as_int()); return;
    case Kind::floating: {
      const double f = v.as_float();
      if (std::isnan(f)) out += "NaN";
      else if (std::isinf(f)) out += f < 0 ? "-Infinity" : "Infinity";
      else out += float_repr(f);
      return;
    }
    case Kind::string: json_string(out, v.str(), o.ensure_ascii); return;
    case Kind::list: {
      const auto& items = v.items();
      if (items.empty()) {
        out += "[]";
        return;
      }
      out.push_back('[');
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) out += item_sep;
        newline(depth + 1);
        json_dump(out, items[i], o, depth + 1);
      }
      newline(depth);
      out.push_back(']');
      return;
    }
    case Kind::dict: {
      std::vector<std::pair<std::string, const Value*>> entries;
      for (const auto& [k, val] : v.dict_data().items) {
        std::string key;
        switch (k.kind()) {
          case Kind::string: key = k.str(); break;
          case Kind::none: key = "null"; break;
          case Kind::boolean: key = k.as_bool() ? "true" : "false"; break;
          case Kind::integer: key = std::to_string(k.as_int()); break;
          case Kind::floating: key = float_repr(k.as_float()); break;
          default: throw EvalError("tojson: keys must be str, int, float, bool or None, not " + type_name(k));
        }
        entries.emplace_back(std::move(key), &val);
      }
      if (o.sort_keys) {
        std::stable_sort(entries.begin(), entries.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
      }
      if (entries.empty()) {
        out += "{}";
        return;
      }
      out.push_back('{');
      for (size_t i = 0; i < entries.size(); ++i) {
        if (i) out += item_sep;
        newline(depth + 1);
        json_string(out, entries[i].first, o.ensure_ascii);
        out += key_sep;
        json_dump(out, *entries[i].second, o, depth + 1);
      }
      newline(depth);
      out.push_back('}');
      return;
    }
    default:
      throw EvalError("tojson: Object of type " + type_name(v) + " is not JSON serializable");
  }
}

}  // namespace

Value from_json(const nlohmann::ordered_json& j) { return from_json_at(j, 0); }

Value from_json_at(const nlohmann::ordered_json& j, int depth) {
  // note: contexts come from requests; bound the recursion like the rest of the renderer.
  if (depth > 256) throw EvalError("context nested deeper than 256 levels");
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null: return Value::none();
    case nlohmann::ordered_json::value_t::boolean: return Value::boolean(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer: return Value::integer(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      const auto u = j.get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX)) return Value::floating(static_cast<double>(u));
      return Value::integer(static_cast<int64_t>(u));
    }
    case nlohmann::ordered_json::value_t::number_float: return Value::floating(j.get<double>());
    case nlohmann::ordered_json::value_t::string: return Value::string(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      std::vector<Value> items;
      items.reserve(j.size());
      for (const auto& e : j) items.push_back(from_json_at(e, depth + 1));
      return Value::list(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      Value d = Value::dict();
      auto& items = d.dict_data().items;
      items.reserve(j.size());
      for (const auto& [k, e] : j.items()) items.emplace_back(Value::string(k), from_json_at(e, depth + 1));
      return d;
    }
    default: return Value::none();
  }
}

std::string to_json(const Value& v, const JsonOptions& options) {
  std::string out;
  json_dump(out, v, options, 0);
  check_string_size(out.size());
  return out;
}

}  // namespace servedeck::worker::tmpl
