// Python methods of str, dict and list reachable from templates (`s.startswith('x')`,
// `d.items()`, `ns.items.append(x)`), as bound functions. Case mapping is ASCII-only.
#include <algorithm>

#include "worker/template/ops.hpp"
#include "worker/template/string_util.hpp"

namespace servedeck::worker::tmpl {

namespace {

using Fn = std::function<Value(CallArgs&)>;

Value make_method(const std::string& name, Fn fn) { return Value::function(name, std::move(fn)); }

std::string require_str(const Value& v, const char* what) {
  if (!v.is_string()) throw EvalError(std::string(what) + " must be str, not " + to_string(v.kind()));
  return v.str();
}

int64_t require_int(const Value& v, const char* what) {
  if (v.is(Kind::boolean)) return v.as_bool() ? 1 : 0;
  if (!v.is(Kind::integer)) throw EvalError(std::string(what) + " must be int, not " + to_string(v.kind()));
  return v.as_int();
}

bool affix_match(const std::string& s, const Value& arg, bool prefix, const char* method) {
  auto test = [&](const std::string& a) {
    if (a.size() > s.size()) return false;
    return prefix ? s.compare(0, a.size(), a) == 0 : s.compare(s.size() - a.size(), a.size(), a) == 0;
  };
  if (arg.is_string()) return test(arg.str());
  if (arg.is(Kind::list) && arg.list_data().is_tuple) {
    for (const auto& x : arg.items()) {
      if (test(require_str(x, method))) return true;
    }
    return false;
  }
  throw EvalError(std::string(method) + " first arg must be str or a tuple of str, not " + to_string(arg.kind()));
}

std::string format_string(const std::string& fmt, const CallArgs& args) {
  std::string out;
  size_t auto_index = 0;
  for (size_t i = 0; i < fmt.size(); ++i) {
    const char c = fmt[i];
    if (c == '{' && i + 1 < fmt.size() && fmt[i + 1] == '{') {
      out.push_back('{');
      ++i;
    } else if (c == '}' && i + 1 < fmt.size() && fmt[i + 1] == '}') {
      out.push_back('}');
      ++i;
    } else if (c == '{') {
      const size_t end = fmt.find('}', i);
      if (end == std::string::npos) throw EvalError("str.format: single '{' encountered in format string");
      const std::string field = fmt.substr(i + 1, end - i - 1);
      if (field.find_first_of(":!.[") != std::string::npos) {
        throw EvalError("str.format: unsupported format field '{" + field + "}'");
      }
      const Value* v = nullptr;
      if (field.empty() || std::all_of(field.begin(), field.end(), [](char d) { return d >= '0' && d <= '9'; })) {
        if (field.size() > 6) throw EvalError("str.format: replacement index " + field + " out of range");
        const size_t idx = field.empty() ? auto_index++ : std::stoul(field);
        if (idx >= args.positional.size()) throw EvalError("str.format: replacement index " + std::to_string(idx) + " out of range");
        v = &args.positional[idx];
      } else {
        for (const auto& [k, val] : args.kwargs) {
          if (k == field) v = &val;
        }
        if (!v) throw EvalError("str.format: no argument named '" + field + "'");
      }
      out += to_str(*v);
      i = end;
    } else if (c == '}') {
      throw EvalError("str.format: single '}' encountered in format string");
    } else {
      out.push_back(c);
    }
  }
  return out;
}

std::optional<Value> string_method(const Value& self, const std::string& name) {
  const std::string s = self.str();
  if (name == "startswith" || name == "endswith") {
    const bool prefix = name == "startswith";
    return make_method(name, [s, prefix, name](CallArgs& a) {
      if (a.positional.empty()) throw EvalError(name + "() takes at least 1 argument (0 given)");
      return Value::boolean(affix_match(s, a.positional[0], prefix, name.c_str()));
    });
  }
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    const bool left = name != "rstrip";
    const bool right = name != "lstrip";
    return make_method(name, [s, left, right](CallArgs& a) {
      const Value& chars = a.get(0, "chars", Value::none());
      if (chars.is_none()) return Value::string(py_strip(s, nullptr, left, right));
      const std::string set = require_str(chars, "strip chars");
      return Value::string(py_strip(s, &set, left, right));
    });
  }
  if (name == "split" || name == "rsplit") {
    const bool from_right = name == "rsplit";
    return make_method(name, [s, from_right](CallArgs& a) {
      const Value& sep = a.get(0, "sep", Value::none());
      const int64_t maxsplit = require_int(a.get(1, "maxsplit", Value::integer(-1)), "maxsplit");
      std::vector<std::string> parts;
      if (sep.is_none()) {
        parts = py_split_whitespace(s, maxsplit, from_right);
      } else {
        const std::string sp = require_str(sep, "sep");
        if (sp.empty()) throw EvalError("empty separator");
        parts = py_split(s, sp, maxsplit, from_right);
      }
      std::vector<Value> out;
      for (auto& p : parts) out.push_back(Value::string(std::move(p)));
      return Value::list(std::move(out));
    });
  }
  if (name == "splitlines") {
    return make_method(name, [s](CallArgs&) {
      std::vector<Value> out;
      size_t start = 0;
      for (size_t i = 0; i < s.size(); ++i) {
        if (s[i] == '\n' || s[i] == '\r') {
          out.push_back(Value::string(s.substr(start, i - start)));
          if (s[i] == '\r' && i + 1 < s.size() && s[i + 1] == '\n') ++i;
          start = i + 1;
        }
      }
      if (start < s.size()) out.push_back(Value::string(s.substr(start)));
      return Value::list(std::move(out));
    });
  }
  if (name == "replace") {
    return make_method(name, [s](CallArgs& a) {
      if (a.positional.size() < 2 && !(a.has(0, "old") && a.has(1, "new"))) throw EvalError("replace() takes at least 2 arguments");
      const std::string from = require_str(a.get(0, "old", Value()), "replace old");
      const std::string to = require_str(a.get(1, "new", Value()), "replace new");
      const int64_t count = require_int(a.get(2, "count", Value::integer(-1)), "replace count");
      return Value::string(py_replace(s, from, to, count));
    });
  }
  if (name == "upper" || name == "lower" || name == "title" || name == "capitalize" || name == "swapcase") {
    return make_method(name, [s, name](CallArgs&) {
      if (name == "upper") return Value::string(ascii_upper(s));
      if (name == "lower") return Value::string(ascii_lower(s));
      if (name == "title") return Value::string(py_title(s));
      if (name == "capitalize") return Value::string(py_capitalize(s));
      std::string out = s;
      for (char& c : out) {
        if (c >= 'a' && c <= 'z') c = static_cast<char>(c - 32);
        else if (c >= 'A' && c <= 'Z') c = static_cast<char>(c + 32);
      }
      return Value::string(std::move(out));
    });
  }
  if (name == "find" || name == "rfind" || name == "index" || name == "rindex" || name == "count") {
    return make_method(name, [s, name](CallArgs& a) {
      const std::string sub = require_str(a.get(0, "sub", Value()), name.c_str());
      if (name == "count") {
        if (sub.empty()) return Value::integer(static_cast<int64_t>(utf8_length(s) + 1));
        int64_t n = 0;
        for (size_t p = s.find(sub); p != std::string::npos; p = s.find(sub, p + sub.size())) ++n;
        return Value::integer(n);
      }
      const bool rev = name[0] == 'r';
      const size_t p = rev ? s.rfind(sub) : s.find(sub);
      if (p == std::string::npos) {
        if (name.find("index") != std::string::npos) throw EvalError("substring not found");
        return Value::integer(-1);
      }
      return Value::integer(static_cast<int64_t>(utf8_length(std::string_view(s).substr(0, p))));
    });
  }
  if (name == "join") {
    return make_method(name, [s](CallArgs& a) {
      std::string out;
      bool first = true;
      for (const auto& item : iterate(a.get(0, "iterable", Value()))) {
        if (!first) out += s;
        first = false;
        out += require_str(item, "join item");
        check_string_size(out.size());
      }
      return Value::string(std::move(out));
    });
  }
  if (name == "format") {
    return make_method(name, [s](CallArgs& a) {
      std::string out = format_string(s, a);
      check_string_size(out.size());
      return Value::string(std::move(out));
    });
  }
  if (name == "removeprefix" || name == "removesuffix") {
    const bool prefix = name == "removeprefix";
    return make_method(name, [s, prefix](CallArgs& a) {
      const std::string x = require_str(a.get(0, "affix", Value()), "affix");
      if (x.size() <= s.size()) {
        if (prefix && s.compare(0, x.size(), x) == 0) return Value::string(s.substr(x.size()));
        if (!prefix && s.compare(s.size() - x.size(), x.size(), x) == 0) return Value::string(s.substr(0, s.size() - x.size()));
      }
      return Value::string(s);
    });
  }
  if (name == "isdigit" || name == "isalpha" || name == "isalnum" || name == "isspace" || name == "islower" ||
      name == "isupper") {
    return make_method(name, [s, name](CallArgs&) { return Value::boolean(py_is(s, name)); });
  }
  return std::nullopt;
}

std::optional<Value> dict_method(const Value& self, const std::string& name) {
  if (name == "items" || name == "keys" || name == "values") {
    return make_method(name, [self, name](CallArgs&) {
      std::vector<Value> out;
      for (const auto& [k, v] : self.dict_data().items) {
        if (name == "items") out.push_back(Value::list({k, v}, true));
        else out.push_back(name == "keys" ? k : v);
      }
      return Value::list(std::move(out));
    });
  }
  if (name == "get") {
    return make_method(name, [self](CallArgs& a) {
      if (a.positional.empty()) throw EvalError("get expected at least 1 argument, got 0");
      const Value* v = self.dict_data().find(a.positional[0]);
      if (v) return *v;
      return a.positional.size() > 1 ? a.positional[1] : Value::none();
    });
  }
  if (name == "copy" || name == "pop" || name == "update" || name == "clear" || name == "setdefault" ||
      name == "popitem" || name == "fromkeys") {
    return make_method(name, [name](CallArgs&) -> Value { throw EvalError("unsupported dict method '" + name + "'"); });
  }
  return std::nullopt;
}

std::optional<Value> list_method(const Value& self, const std::string& name) {
  if (name == "append") {
    return make_method(name, [self](CallArgs& a) {
      if (a.positional.size() != 1) throw EvalError("append() takes exactly one argument");
      if (self.items().size() >= (max_string_bytes() / 16)) throw EvalError("list too long");
      self.items().push_back(a.positional[0]);
      return Value::none();
    });
  }
  if (name == "index" || name == "count") {
    return make_method(name, [self, name](CallArgs& a) {
      if (a.positional.empty()) throw EvalError(name + "() takes at least 1 argument");
      int64_t n = 0;
      const auto& items = self.items();
      for (size_t i = 0; i < items.size(); ++i) {
        if (!equals(items[i], a.positional[0])) continue;
        if (name == "index") return Value::integer(static_cast<int64_t>(i));
        ++n;
      }
      if (name == "index") throw EvalError(to_repr(a.positional[0]) + " is not in list");
      return Value::integer(n);
    });
  }
  return std::nullopt;
}

}  // namespace

std::optional<Value> lookup_method(const Value& obj, const std::string& name) {
  switch (obj.kind()) {
    case Kind::string: return string_method(obj, name);
    case Kind::dict: return dict_method(obj, name);
    case Kind::list: return list_method(obj, name);
    default: return std::nullopt;
  }
}

}  // namespace servedeck::worker::tmpl
