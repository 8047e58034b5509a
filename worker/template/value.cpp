#include "worker/template/value.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

namespace servedeck::worker::tmpl {

namespace {

// note: bounds repr/str/== recursion; real chat-template data nests < 20 levels, and a
// self-containing list (possible through list.append) must end in an error, not a crash.
constexpr int k_max_depth = 200;

void check_depth(int depth) {
  if (depth > k_max_depth) {
    throw EvalError("value nested deeper than " + std::to_string(k_max_depth) + " levels (or cyclic)");
  }
}

// Decodes one UTF-8 code point at s[i]; returns the code point (or the byte for an invalid
// sequence) and sets `len`.
uint32_t decode_utf8(std::string_view s, size_t i, size_t& len) {
  const auto c = static_cast<unsigned char>(s[i]);
  int need = 0;
  uint32_t cp = 0;
  if (c < 0x80) {
    len = 1;
    return c;
  } else if ((c & 0xE0) == 0xC0) {
    need = 1;
    cp = c & 0x1F;
  } else if ((c & 0xF0) == 0xE0) {
    need = 2;
    cp = c & 0x0F;
  } else if ((c & 0xF8) == 0xF0) {
    need = 3;
    cp = c & 0x07;
  } else {
    len = 1;
    return c;
  }
  if (i + static_cast<size_t>(need) >= s.size()) {
    len = 1;
    return c;
  }
  for (int k = 1; k <= need; ++k) {
    const auto cc = static_cast<unsigned char>(s[i + static_cast<size_t>(k)]);
    if ((cc & 0xC0) != 0x80) {
      len = 1;
      return c;
    }
    cp = (cp << 6) | (cc & 0x3F);
  }
  len = static_cast<size_t>(need) + 1;
  return cp;
}

// Code points Python's str.isprintable() rejects, approximated: C0/C1 controls, NBSP, soft
// hyphen, Unicode separators and format characters in common ranges.
bool non_printable(uint32_t cp) {
  if (cp < 0x20 || (cp >= 0x7F && cp <= 0xA0) || cp == 0xAD) return true;
  if ((cp >= 0x2000 && cp <= 0x200F) || (cp >= 0x2028 && cp <= 0x202F) || (cp >= 0x205F && cp <= 0x206F)) return true;
  if (cp == 0x3000 || cp == 0xFEFF || (cp >= 0xFFF9 && cp <= 0xFFFB)) return true;
  return false;
}

std::string repr_string(std::string_view s) {
  const bool has_single = s.find('\'') != std::string_view::npos;
  const bool has_double = s.find('"') != std::string_view::npos;
  const char quote = (has_single && !has_double) ? '"' : '\'';
  std::string out;
  out.reserve(s.size() + 2);
  out.push_back(quote);
  for (size_t i = 0; i < s.size();) {
    size_t len = 1;
    const uint32_t cp = decode_utf8(s, i, len);
    char buf[16];
    if (cp == '\\') {
      out += "\\\\";
    } else if (cp == static_cast<uint32_t>(quote)) {
      out.push_back('\\');
      out.push_back(quote);
    } else if (cp == '\n') {
      out += "\\n";
    } else if (cp == '\r') {
      out += "\\r";
    } else if (cp == '\t') {
      out += "\\t";
    } else if (non_printable(cp)) {
      if (cp < 0x100) {
        std::snprintf(buf, sizeof buf, "\\x%02x", static_cast<unsigned>(cp));
      } else {
        std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(cp));
      }
      out += buf;
    } else {
      out.append(s.substr(i, len));
    }
    i += len;
  }
  out.push_back(quote);
  return out;
}

void append_str(std::string& out, const Value& v, bool repr, int depth) {
  check_depth(depth);
  switch (v.kind()) {
    case Kind::undefined:
      return;
    case Kind::none:
      out += "None";
      return;
    case Kind::boolean:
      out += v.as_bool() ? "True" : "False";
      return;
    case Kind::integer:
      out += std::to_string(v.as_int());
      return;
    case Kind::floating:
      out += float_repr(v.as_float());
      return;
    case Kind::string:
      out += repr ? repr_string(v.str()) : v.str();
      return;
    case Kind::list: {
      const bool tuple = v.list_data().is_tuple;
      out.push_back(tuple ? '(' : '[');
      const auto& items = v.items();
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) out += ", ";
        append_str(out, items[i], true, depth + 1);
      }
      if (tuple && items.size() == 1) out.push_back(',');
      out.push_back(tuple ? ')' : ']');
      return;
    }
    case Kind::dict:
    case Kind::ns:
    case Kind::object: {
      if (v.kind() == Kind::ns) out += "<Namespace ";
      out.push_back('{');
      const auto& items = v.dict_data().items;
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) out += ", ";
        append_str(out, items[i].first, true, depth + 1);
        out += ": ";
        append_str(out, items[i].second, true, depth + 1);
      }
      out.push_back('}');
      if (v.kind() == Kind::ns) out.push_back('>');
      return;
    }
    case Kind::function:
      out += "<function " + v.fn().name + ">";
      return;
  }
}

bool equals_at(const Value& a, const Value& b, int depth) {
  check_depth(depth);
  if (a.is_number() && b.is_number()) {
    if (a.is(Kind::floating) || b.is(Kind::floating)) return a.as_double() == b.as_double();
    const int64_t x = a.is(Kind::boolean) ? (a.as_bool() ? 1 : 0) : a.as_int();
    const int64_t y = b.is(Kind::boolean) ? (b.as_bool() ? 1 : 0) : b.as_int();
    return x == y;
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Kind::undefined:
    case Kind::none:
      return true;
    case Kind::string:
      return a.str() == b.str();
    case Kind::list: {
      if (a.list_ptr() == b.list_ptr()) return true;
      if (a.list_data().is_tuple != b.list_data().is_tuple) return false;
      const auto& x = a.items();
      const auto& y = b.items();
      if (x.size() != y.size()) return false;
      for (size_t i = 0; i < x.size(); ++i) {
        if (!equals_at(x[i], y[i], depth + 1)) return false;
      }
      return true;
    }
    case Kind::dict: {
      if (a.dict_ptr() == b.dict_ptr()) return true;
      const auto& x = a.dict_data().items;
      if (x.size() != b.dict_data().items.size()) return false;
      for (const auto& [k, val] : x) {
        const Value* other = b.dict_data().find(k);
        if (!other || !equals_at(val, *other, depth + 1)) return false;
      }
      return true;
    }
    case Kind::ns:
    case Kind::object:
      return a.dict_ptr() == b.dict_ptr();
    case Kind::function:
      return &a.fn() == &b.fn();
    default:
      return false;
  }
}

}  // namespace

const char* to_string(Kind kind) {
  switch (kind) {
    case Kind::undefined: return "Undefined";
    case Kind::none: return "NoneType";
    case Kind::boolean: return "bool";
    case Kind::integer: return "int";
    case Kind::floating: return "float";
    case Kind::string: return "str";
    case Kind::list: return "list";
    case Kind::dict: return "dict";
    case Kind::ns: return "Namespace";
    case Kind::object: return "object";
    case Kind::function: return "function";
  }
  return "?";
}

const Value* DictData::find(const Value& key) const {
  if (key.is_string()) return find(std::string_view(key.str()));
  for (const auto& [k, v] : items) {
    if (equals(k, key)) return &v;
  }
  return nullptr;
}

const Value* DictData::find(std::string_view key) const {
  for (const auto& [k, v] : items) {
    if (k.is_string() && k.str() == key) return &v;
  }
  return nullptr;
}

void DictData::set(const Value& key, Value value) {
  for (auto& [k, v] : items) {
    if (equals(k, key)) {
      v = std::move(value);
      return;
    }
  }
  items.emplace_back(key, std::move(value));
}

const std::shared_ptr<const std::string>& Value::empty_string() {
  static const auto empty = std::make_shared<const std::string>();
  return empty;
}

Value Value::undefined(std::string name) {
  Value v;
  if (!name.empty()) v.s_ = std::make_shared<const std::string>(std::move(name));
  return v;
}
Value Value::none() {
  Value v;
  v.kind_ = Kind::none;
  return v;
}
Value Value::boolean(bool b) {
  Value v;
  v.kind_ = Kind::boolean;
  v.b_ = b;
  return v;
}
Value Value::integer(int64_t i) {
  Value v;
  v.kind_ = Kind::integer;
  v.i_ = i;
  return v;
}
Value Value::floating(double f) {
  Value v;
  v.kind_ = Kind::floating;
  v.f_ = f;
  return v;
}
Value Value::string(std::string s) {
  Value v;
  v.kind_ = Kind::string;
  v.s_ = std::make_shared<const std::string>(std::move(s));
  return v;
}
Value Value::list(std::vector<Value> items, bool is_tuple) {
  Value v;
  v.kind_ = Kind::list;
  v.list_ = std::make_shared<ListData>();
  v.list_->items = std::move(items);
  v.list_->is_tuple = is_tuple;
  return v;
}
Value Value::dict() {
  Value v;
  v.kind_ = Kind::dict;
  v.dict_ = std::make_shared<DictData>();
  return v;
}
Value Value::ns() {
  Value v = dict();
  v.kind_ = Kind::ns;
  return v;
}
Value Value::object() {
  Value v = dict();
  v.kind_ = Kind::object;
  return v;
}
Value Value::function(std::string name, std::function<Value(CallArgs&)> call) {
  Value v;
  v.kind_ = Kind::function;
  v.fn_ = std::make_shared<FunctionData>(FunctionData{std::move(name), std::move(call)});
  return v;
}

double Value::as_double() const {
  switch (kind_) {
    case Kind::boolean: return b_ ? 1.0 : 0.0;
    case Kind::integer: return static_cast<double>(i_);
    case Kind::floating: return f_;
    default: return 0.0;
  }
}

bool Value::truthy() const {
  switch (kind_) {
    case Kind::undefined:
    case Kind::none: return false;
    case Kind::boolean: return b_;
    case Kind::integer: return i_ != 0;
    case Kind::floating: return f_ != 0.0;
    case Kind::string: return !s_->empty();
    case Kind::list: return !list_->items.empty();
    case Kind::dict: return !dict_->items.empty();
    default: return true;
  }
}

Value CallArgs::get(size_t index, std::string_view name, const Value& fallback) const {
  if (index < positional.size()) return positional[index];
  for (const auto& [k, v] : kwargs) {
    if (k == name) return v;
  }
  return fallback;
}

bool CallArgs::has(size_t index, std::string_view name) const {
  if (index < positional.size()) return true;
  for (const auto& kv : kwargs) {
    if (kv.first == name) return true;
  }
  return false;
}

bool equals(const Value& a, const Value& b) { return equals_at(a, b, 0); }

std::string to_str(const Value& v) {
  if (v.is_string()) return v.str();
  std::string out;
  append_str(out, v, false, 0);
  return out;
}

std::string to_repr(const Value& v) {
  std::string out;
  append_str(out, v, true, 0);
  return out;
}

std::string float_repr(double f) {
  if (std::isnan(f)) return "nan";
  if (std::isinf(f)) return f < 0 ? "-inf" : "inf";
  if (f == 0.0) return std::signbit(f) ? "-0.0" : "0.0";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, f, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  // sci: [-]d[.ddd]e[+-]XX
  std::string sign;
  if (sci[0] == '-') {
    sign = "-";
    sci.erase(0, 1);
  }
  const size_t e = sci.find('e');
  std::string digits = sci.substr(0, e);
  const int exp10 = std::stoi(sci.substr(e + 1));
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  const int ndigits = static_cast<int>(digits.size());
  const int decpt = exp10 + 1;  // position of the decimal point relative to digits
  std::string out = sign;
  if (decpt <= -4 || decpt > 16) {
    out += digits.substr(0, 1);
    if (ndigits > 1) out += "." + digits.substr(1);
    char eb[16];
    std::snprintf(eb, sizeof eb, "e%c%02d", exp10 < 0 ? '-' : '+', exp10 < 0 ? -exp10 : exp10);
    out += eb;
  } else if (decpt <= 0) {
    out += "0." + std::string(static_cast<size_t>(-decpt), '0') + digits;
  } else if (decpt >= ndigits) {
    out += digits + std::string(static_cast<size_t>(decpt - ndigits), '0') + ".0";
  } else {
    out += digits.substr(0, static_cast<size_t>(decpt)) + "." + digits.substr(static_cast<size_t>(decpt));
  }
  return out;
}

size_t utf8_length(std::string_view s) {
  size_t n = 0;
  for (size_t i = 0; i < s.size();) {
    size_t len = 1;
    decode_utf8(s, i, len);
    i += len;
    ++n;
  }
  return n;
}

std::vector<size_t> utf8_offsets(std::string_view s) {
  std::vector<size_t> out;
  out.reserve(s.size() + 1);
  for (size_t i = 0; i < s.size();) {
    out.push_back(i);
    size_t len = 1;
    decode_utf8(s, i, len);
    i += len;
  }
  out.push_back(s.size());
  return out;
}

}  // namespace servedeck::worker::tmpl
