// Implementation of worker/template/ops.hpp: attribute and item lookup, slicing, iteration,
// ordering, membership, arithmetic, printf-style formatting and the string size bound. JSON in
// and out (from_json, to_json) is in ops_json.cpp.
#include "worker/template/ops.hpp"

#include <algorithm>
#include <cmath>
#include <cctype>
#include <cstdio>
#include <cstring>

#include "worker/template/ops_internal.hpp"

namespace servedeck::worker::tmpl {

using detail::type_name;

namespace {

thread_local size_t t_max_string_bytes = size_t{64} << 20;

std::string obj_desc(const Value& v) { return "'" + type_name(v) + " object'"; }

int64_t as_index(const Value& v) { return v.is(Kind::boolean) ? (v.as_bool() ? 1 : 0) : v.as_int(); }

bool is_int_like(const Value& v) { return v.is(Kind::integer) || v.is(Kind::boolean); }

// CPython PySlice_AdjustIndices: resolves start/stop for a sequence of `length`.
std::vector<size_t> slice_positions(size_t length, std::optional<int64_t> start, std::optional<int64_t> stop,
                                    int64_t step) {
  const auto len = static_cast<int64_t>(length);
  int64_t lo = 0;
  int64_t hi = 0;
  if (step > 0) {
    lo = start ? *start : 0;
    hi = stop ? *stop : len;
    if (lo < 0) lo = std::max<int64_t>(lo + len, 0);
    if (lo > len) lo = len;
    if (hi < 0) hi = std::max<int64_t>(hi + len, 0);
    if (hi > len) hi = len;
  } else {
    lo = start ? *start : len - 1;
    hi = stop ? *stop : -1;
    if (start) {
      if (lo < 0) lo = std::max<int64_t>(lo + len, -1);
      if (lo >= len) lo = len - 1;
    }
    if (stop) {
      if (hi < 0) hi = std::max<int64_t>(hi + len, -1);
      if (hi >= len) hi = len - 1;
    }
  }
  std::vector<size_t> out;
  if (step > 0) {
    for (int64_t i = lo; i < hi; i += step) out.push_back(static_cast<size_t>(i));
  } else {
    for (int64_t i = lo; i > hi; i += step) out.push_back(static_cast<size_t>(i));
  }
  return out;
}


void check_overflow(bool overflow) {
  if (overflow) throw EvalError("integer overflow (servedeck templates use 64-bit integers)");
}

}  // namespace

std::string printf_format(const std::string& fmt, const std::vector<Value>& args) {
  std::string out;
  size_t next = 0;
  for (size_t i = 0; i < fmt.size(); ++i) {
    if (fmt[i] != '%') {
      out.push_back(fmt[i]);
      continue;
    }
    if (++i >= fmt.size()) throw EvalError("incomplete format");
    if (fmt[i] == '%') {
      out.push_back('%');
      continue;
    }
    if (fmt[i] == '(') throw EvalError("unsupported printf-style format: named fields '%(name)'");
    std::string spec = "%";
    while (i < fmt.size() && std::strchr("-+ 0#", fmt[i])) spec.push_back(fmt[i++]);
    while (i < fmt.size() && spec.size() < 8 && std::isdigit(static_cast<unsigned char>(fmt[i]))) spec.push_back(fmt[i++]);
    if (i < fmt.size() && fmt[i] == '.') {
      spec.push_back(fmt[i++]);
      while (i < fmt.size() && spec.size() < 12 && std::isdigit(static_cast<unsigned char>(fmt[i]))) spec.push_back(fmt[i++]);
    }
    if (i >= fmt.size()) throw EvalError("incomplete format");
    const char type = fmt[i];
    if (next >= args.size()) throw EvalError("not enough arguments for format string");
    const Value& v = args[next++];
    char buf[512];
    if (type == 's' || type == 'r' || type == 'a') {
      if (spec != "%") throw EvalError("unsupported printf-style format '" + spec + type + "'");
      out += type == 's' ? to_str(v) : to_repr(v);
    } else if (type == 'd' || type == 'i' || type == 'x' || type == 'X' || type == 'o') {
      if (!v.is_number()) throw EvalError(std::string("%") + type + " format: a real number is required, not " + type_name(v));
      const double f = v.as_double();
      if (v.is(Kind::floating) && !(std::fabs(f) < 9.2e18)) throw EvalError("%d format: number out of range");
      const long long n = v.is(Kind::floating) ? static_cast<long long>(f) : as_index(v);
      std::snprintf(buf, sizeof buf, (spec + "ll" + (type == 'i' ? 'd' : type)).c_str(), n);
      out += buf;
    } else if (type == 'f' || type == 'F' || type == 'e' || type == 'E' || type == 'g' || type == 'G') {
      if (!v.is_number()) throw EvalError(std::string("%") + type + " format: a real number is required, not " + type_name(v));
      std::snprintf(buf, sizeof buf, (spec + type).c_str(), v.as_double());
      out += buf;
    } else {
      throw EvalError(std::string("unsupported format character '") + type + "'");
    }
    check_string_size(out.size());
  }
  if (next < args.size()) throw EvalError("not all arguments converted during string formatting");
  return out;
}

void set_max_string_bytes(size_t bytes) { t_max_string_bytes = bytes; }
size_t max_string_bytes() { return t_max_string_bytes; }
void check_string_size(size_t size) {
  if (size > t_max_string_bytes) {
    throw EvalError("string of " + std::to_string(size) + " bytes exceeds the limit of " +
                    std::to_string(t_max_string_bytes) + " bytes");
  }
}

void fail_undefined(const Value& v) {
  throw EvalError(v.undefined_name().empty() ? std::string("undefined value") : v.undefined_name());
}

Value get_attr(const Value& obj, const std::string& name) {
  if (obj.is_undefined()) fail_undefined(obj);
  if (auto m = lookup_method(obj, name)) return *m;
  if (obj.has_attrs()) {
    if (const Value* v = obj.dict_data().find(name)) return *v;
  }
  return Value::undefined(obj_desc(obj) + " has no attribute '" + name + "'");
}

Value get_item(const Value& obj, const Value& key) {
  if (obj.is_undefined()) fail_undefined(obj);
  if (obj.is(Kind::dict)) {
    if (const Value* v = obj.dict_data().find(key)) return *v;
  } else if ((obj.is(Kind::list) || obj.is_string()) && is_int_like(key)) {
    int64_t i = as_index(key);
    if (obj.is(Kind::list)) {
      const auto n = static_cast<int64_t>(obj.items().size());
      if (i < 0) i += n;
      if (i >= 0 && i < n) return obj.items()[static_cast<size_t>(i)];
    } else {
      const auto offs = utf8_offsets(obj.str());
      const auto n = static_cast<int64_t>(offs.size()) - 1;
      if (i < 0) i += n;
      if (i >= 0 && i < n) {
        const auto k = static_cast<size_t>(i);
        return Value::string(obj.str().substr(offs[k], offs[k + 1] - offs[k]));
      }
    }
    return Value::undefined(obj_desc(obj) + " has no element " + std::to_string(as_index(key)));
  }
  if (key.is_string()) return get_attr(obj, key.str());
  return Value::undefined(obj_desc(obj) + " has no element " + to_repr(key));
}

Value slice_value(const Value& obj, std::optional<int64_t> start, std::optional<int64_t> stop,
                  std::optional<int64_t> step) {
  const int64_t st = step ? *step : 1;
  if (st == 0) throw EvalError("slice step cannot be zero");
  if (obj.is(Kind::list)) {
    std::vector<Value> out;
    for (size_t i : slice_positions(obj.items().size(), start, stop, st)) out.push_back(obj.items()[i]);
    return Value::list(std::move(out), obj.list_data().is_tuple);
  }
  if (obj.is_string()) {
    const auto offs = utf8_offsets(obj.str());
    std::string out;
    for (size_t i : slice_positions(offs.size() - 1, start, stop, st)) out.append(obj.str(), offs[i], offs[i + 1] - offs[i]);
    return Value::string(std::move(out));
  }
  if (obj.is_undefined()) fail_undefined(obj);
  return Value::undefined(obj_desc(obj) + " cannot be sliced");
}

std::vector<Value> iterate(const Value& v) {
  switch (v.kind()) {
    case Kind::undefined: return {};
    case Kind::list: return v.items();
    case Kind::dict: {
      std::vector<Value> keys;
      for (const auto& kv : v.dict_data().items) keys.push_back(kv.first);
      return keys;
    }
    case Kind::string: {
      std::vector<Value> out;
      const auto offs = utf8_offsets(v.str());
      for (size_t i = 0; i + 1 < offs.size(); ++i) out.push_back(Value::string(v.str().substr(offs[i], offs[i + 1] - offs[i])));
      return out;
    }
    default:
      throw EvalError("'" + type_name(v) + "' object is not iterable");
  }
}

int compare(const Value& a, const Value& b) {
  if (a.is_undefined()) fail_undefined(a);
  if (b.is_undefined()) fail_undefined(b);
  if (a.is_number() && b.is_number()) {
    if (is_int_like(a) && is_int_like(b)) {
      const int64_t x = as_index(a);
      const int64_t y = as_index(b);
      return x < y ? -1 : x > y ? 1 : 0;
    }
    const double x = a.as_double();
    const double y = b.as_double();
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (a.is_string() && b.is_string()) {
    const int c = a.str().compare(b.str());
    return c < 0 ? -1 : c > 0 ? 1 : 0;
  }
  if (a.is(Kind::list) && b.is(Kind::list) && a.list_data().is_tuple == b.list_data().is_tuple) {
    const auto& x = a.items();
    const auto& y = b.items();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (equals(x[i], y[i])) continue;
      return compare(x[i], y[i]);
    }
    return x.size() < y.size() ? -1 : x.size() > y.size() ? 1 : 0;
  }
  throw EvalError("'<' not supported between instances of '" + type_name(a) + "' and '" + type_name(b) + "'");
}

bool contains(const Value& container, const Value& item) {
  switch (container.kind()) {
    case Kind::undefined: return false;
    case Kind::string:
      if (!item.is_string()) throw EvalError("'in <string>' requires string as left operand, not " + type_name(item));
      return container.str().find(item.str()) != std::string::npos;
    case Kind::list:
      return std::any_of(container.items().begin(), container.items().end(),
                         [&](const Value& x) { return equals(x, item); });
    case Kind::dict: return container.dict_data().find(item) != nullptr;
    default:
      throw EvalError("argument of type '" + type_name(container) + "' is not iterable");
  }
}

Value arithmetic(const std::string& op, const Value& a, const Value& b) {
  if (a.is_undefined()) fail_undefined(a);
  if (b.is_undefined()) fail_undefined(b);
  const auto unsupported = [&]() -> EvalError {
    return EvalError("unsupported operand type(s) for " + op + ": '" + type_name(a) + "' and '" + type_name(b) + "'");
  };
  if (a.is_number() && b.is_number()) {
    const bool ints = is_int_like(a) && is_int_like(b);
    if (ints) {
      const int64_t x = as_index(a);
      const int64_t y = as_index(b);
      int64_t r = 0;
      if (op == "+") {
        check_overflow(__builtin_add_overflow(x, y, &r));
        return Value::integer(r);
      }
      if (op == "-") {
        check_overflow(__builtin_sub_overflow(x, y, &r));
        return Value::integer(r);
      }
      if (op == "*") {
        check_overflow(__builtin_mul_overflow(x, y, &r));
        return Value::integer(r);
      }
      if (op == "/") {
        if (y == 0) throw EvalError("division by zero");
        return Value::floating(static_cast<double>(x) / static_cast<double>(y));
      }
      if (op == "//" || op == "%") {
        if (y == 0) throw EvalError("integer division or modulo by zero");
        if (x == INT64_MIN && y == -1) throw EvalError("integer overflow");
        int64_t q = x / y;
        int64_t m = x % y;
        if (m != 0 && ((m < 0) != (y < 0))) {
          --q;
          m += y;
        }
        return Value::integer(op == "//" ? q : m);
      }
      if (op == "**") {
        if (y < 0) return Value::floating(std::pow(static_cast<double>(x), static_cast<double>(y)));
        int64_t result = 1;
        int64_t base = x;
        int64_t e = y;
        while (e > 0) {
          if (e & 1) check_overflow(__builtin_mul_overflow(result, base, &result));
          e >>= 1;
          if (e > 0) check_overflow(__builtin_mul_overflow(base, base, &base));
        }
        return Value::integer(result);
      }
      throw unsupported();
    }
    const double x = a.as_double();
    const double y = b.as_double();
    if (op == "+") return Value::floating(x + y);
    if (op == "-") return Value::floating(x - y);
    if (op == "*") return Value::floating(x * y);
    if (op == "/" || op == "//" || op == "%") {
      if (y == 0.0) throw EvalError("float division by zero");
      if (op == "/") return Value::floating(x / y);
      if (op == "//") return Value::floating(std::floor(x / y));
      double m = std::fmod(x, y);
      if (m != 0.0 && ((m < 0) != (y < 0))) m += y;
      return Value::floating(m);
    }
    if (op == "**") {
      if (x == 0.0 && y < 0) throw EvalError("0.0 cannot be raised to a negative power");
      return Value::floating(std::pow(x, y));
    }
    throw unsupported();
  }
  if (op == "+") {
    if (a.is_string() && b.is_string()) {
      check_string_size(a.str().size() + b.str().size());
      return Value::string(a.str() + b.str());
    }
    if (a.is(Kind::list) && b.is(Kind::list) && a.list_data().is_tuple == b.list_data().is_tuple) {
      std::vector<Value> out = a.items();
      out.insert(out.end(), b.items().begin(), b.items().end());
      return Value::list(std::move(out), a.list_data().is_tuple);
    }
    throw unsupported();
  }
  if (op == "*") {
    const Value* seq = is_int_like(b) ? &a : &b;
    const Value* count = is_int_like(b) ? &b : &a;
    if (!is_int_like(*count) || !(seq->is_string() || seq->is(Kind::list))) throw unsupported();
    const int64_t n = std::max<int64_t>(as_index(*count), 0);
    if (seq->is_string()) {
      if (n > 0) check_string_size(seq->str().size() * static_cast<size_t>(std::min<int64_t>(n, INT32_MAX)));
      std::string out;
      for (int64_t i = 0; i < n; ++i) out += seq->str();
      return Value::string(std::move(out));
    }
    if (n > 0 && seq->items().size() * static_cast<size_t>(std::min<int64_t>(n, INT32_MAX)) > max_string_bytes() / 8) {
      throw EvalError("list repetition too large");
    }
    std::vector<Value> out;
    for (int64_t i = 0; i < n; ++i) out.insert(out.end(), seq->items().begin(), seq->items().end());
    return Value::list(std::move(out), seq->list_data().is_tuple);
  }
  if (op == "%" && a.is_string()) {
    if (b.is(Kind::list) && b.list_data().is_tuple) return Value::string(printf_format(a.str(), b.items()));
    return Value::string(printf_format(a.str(), {b}));
  }
  throw unsupported();
}


}  // namespace servedeck::worker::tmpl
