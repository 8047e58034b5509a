// Builtin filters, jinja2 3.1 semantics; `tojson` as transformers defines it.
#include "worker/template/filters.hpp"

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "worker/template/ops.hpp"
#include "worker/template/string_util.hpp"

namespace servedeck::worker::tmpl {

namespace {

constexpr std::array<std::string_view, 41> k_filters = {
    "abs", "attr", "batch", "capitalize", "count", "d", "default", "dictsort", "e", "escape",
    "first", "float", "forceescape", "indent", "int", "items", "join", "last", "length", "list",
    "lower", "map", "max", "min", "reject", "rejectattr", "replace", "reverse", "round", "safe",
    "select", "selectattr", "sort", "string", "sum", "title", "tojson", "trim", "unique", "upper",
    "format"};

const Value k_none = Value::none();
const Value k_false = Value::boolean(false);
const Value k_undef;

bool flag(const Value& v) { return v.truthy(); }

int64_t int_arg(const Value& v, const char* what) {
  if (v.is(Kind::boolean)) return v.as_bool() ? 1 : 0;
  if (!v.is(Kind::integer)) throw EvalError(std::string(what) + " must be an integer, not " + to_string(v.kind()));
  return v.as_int();
}

// Python int(str, base=10): optional whitespace and sign, digits with single underscores.
bool parse_py_int(std::string s, int64_t& out) {
  s = py_strip(s, nullptr, true, true);
  std::string digits;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '_' && i > 0 && i + 1 < s.size() && std::isdigit(static_cast<unsigned char>(s[i - 1])) &&
        std::isdigit(static_cast<unsigned char>(s[i + 1]))) {
      continue;
    }
    digits.push_back(s[i]);
  }
  size_t i = (!digits.empty() && (digits[0] == '+' || digits[0] == '-')) ? 1 : 0;
  if (i >= digits.size()) return false;
  for (size_t k = i; k < digits.size(); ++k) {
    if (!std::isdigit(static_cast<unsigned char>(digits[k]))) return false;
  }
  errno = 0;
  const long long v = std::strtoll(digits.c_str(), nullptr, 10);
  if (errno != 0) return false;
  out = v;
  return true;
}

// Python float(str): whitespace-trimmed decimal or inf/nan.
bool parse_py_float(std::string s, double& out) {
  s = py_strip(s, nullptr, true, true);
  if (s.empty()) return false;
  std::string t;
  for (char c : s) {
    if (c != '_') t.push_back(c);
  }
  const std::string low = ascii_lower(t);
  if (low == "inf" || low == "+inf" || low == "infinity" || low == "+infinity") { out = INFINITY; return true; }
  if (low == "-inf" || low == "-infinity") { out = -INFINITY; return true; }
  if (low == "nan" || low == "+nan" || low == "-nan") { out = NAN; return true; }
  for (char c : t) {
    if (!(std::isdigit(static_cast<unsigned char>(c)) || c == '.' || c == 'e' || c == 'E' || c == '+' || c == '-')) return false;
  }
  char* end = nullptr;
  out = std::strtod(t.c_str(), &end);
  return end && *end == '\0';
}

size_t length_of(const Value& v) {
  switch (v.kind()) {
    case Kind::undefined: return 0;
    case Kind::string: return utf8_length(v.str());
    case Kind::list: return v.items().size();
    case Kind::dict: return v.dict_data().items.size();
    default: throw EvalError(std::string("object of type '") + to_string(v.kind()) + "' has no len()");
  }
}

// jinja2 make_attrgetter: "a.b.0" walks attributes/items; integer parts index.
Value attr_path(const Value& item, const Value& attribute) {
  if (attribute.is(Kind::integer)) return get_item(item, attribute);
  const std::string path = to_str(attribute);
  Value cur = item;
  size_t start = 0;
  while (true) {
    const size_t dot = path.find('.', start);
    const std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    int64_t idx = 0;
    if (!part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; }) &&
        part.size() < 18) {
      idx = std::stoll(part);
      cur = get_item(cur, Value::integer(idx));
    } else {
      cur = get_item(cur, Value::string(part));
    }
    if (dot == std::string::npos) return cur;
    if (cur.is_undefined()) return cur;
    start = dot + 1;
  }
}

// Sort key: lower-cased strings unless case-sensitive (jinja2 ignore_case).
Value sort_key(const Value& v, bool case_sensitive) {
  if (!case_sensitive && v.is_string()) return Value::string(ascii_lower(v.str()));
  return v;
}

std::vector<Value> sorted(std::vector<Value> items, const Value& attribute, bool case_sensitive, bool reverse) {
  std::vector<std::pair<Value, Value>> keyed;
  for (auto& it : items) {
    Value k = attribute.is_none() ? it : attr_path(it, attribute);
    keyed.emplace_back(sort_key(k, case_sensitive), std::move(it));
  }
  std::stable_sort(keyed.begin(), keyed.end(), [reverse](const auto& a, const auto& b) {
    return reverse ? compare(b.first, a.first) < 0 : compare(a.first, b.first) < 0;
  });
  std::vector<Value> out;
  for (auto& kv : keyed) out.push_back(std::move(kv.second));
  return out;
}

// Arguments after the first `skip` positional ones, for select/map passing through.
CallArgs shifted(const CallArgs& args, size_t skip) {
  CallArgs out;
  for (size_t i = skip; i < args.positional.size(); ++i) out.positional.push_back(args.positional[i]);
  out.kwargs = args.kwargs;
  return out;
}

Value select_like(const Value& operand, const CallArgs& args, bool by_attr, bool keep) {
  std::vector<Value> out;
  const size_t skip = by_attr ? 1 : 0;
  if (by_attr && args.positional.empty()) throw EvalError("selectattr/rejectattr need an attribute name");
  const bool has_test = args.positional.size() > skip;
  std::string test;
  if (has_test) test = to_str(args.positional[skip]);
  const CallArgs test_args = shifted(args, skip + 1);
  for (const auto& item : iterate(operand)) {
    const Value v = by_attr ? attr_path(item, args.positional[0]) : item;
    const bool ok = has_test ? apply_test(test, v, test_args) : v.truthy();
    if (ok == keep) out.push_back(item);
  }
  return Value::list(std::move(out));
}

std::vector<std::string> split_lines(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\n' || s[i] == '\r') {
      out.push_back(s.substr(start, i - start));
      if (s[i] == '\r' && i + 1 < s.size() && s[i + 1] == '\n') ++i;
      start = i + 1;
    }
  }
  if (start < s.size()) out.push_back(s.substr(start));
  return out;
}

Value round_value(const Value& v, int64_t precision, const std::string& method) {
  if (!v.is_number()) throw EvalError(std::string("round: expected a number, got ") + to_string(v.kind()));
  if (method != "common" && method != "ceil" && method != "floor") {
    throw EvalError("round: method must be 'common', 'ceil' or 'floor'");
  }
  const double x = v.as_double();
  if (method == "common") {
    if (!v.is(Kind::floating)) return v.is(Kind::boolean) ? Value::integer(v.as_bool() ? 1 : 0) : v;
    if (!std::isfinite(x) || precision > 300) return v;
    if (precision < 0) {
      const double p = std::pow(10.0, static_cast<double>(-precision));
      return Value::floating(std::nearbyint(x / p) * p);
    }
    char buf[400];
    std::snprintf(buf, sizeof buf, "%.*f", static_cast<int>(precision), x);
    return Value::floating(std::strtod(buf, nullptr));
  }
  const double p = std::pow(10.0, static_cast<double>(precision));
  return Value::floating((method == "ceil" ? std::ceil(x * p) : std::floor(x * p)) / p);
}

Value tojson(const Value& operand, const CallArgs& args) {
  JsonOptions o;
  o.ensure_ascii = flag(args.get(0, "ensure_ascii", k_false));
  const Value& indent = args.get(1, "indent", k_none);
  if (indent.is(Kind::integer) || indent.is(Kind::boolean)) {
    const int64_t n = int_arg(indent, "indent");
    o.indent = std::string(static_cast<size_t>(std::clamp<int64_t>(n, 0, 64)), ' ');
  } else if (indent.is_string()) {
    o.indent = indent.str();
  } else if (!indent.is_none()) {
    throw EvalError("tojson: indent must be an int, a string or None");
  }
  const Value& seps = args.get(2, "separators", k_none);
  if (seps.is(Kind::list)) {
    if (seps.items().size() != 2 || !seps.items()[0].is_string() || !seps.items()[1].is_string()) {
      throw EvalError("tojson: separators must be a pair of strings");
    }
    o.separators = std::make_pair(seps.items()[0].str(), seps.items()[1].str());
  } else if (!seps.is_none()) {
    throw EvalError("tojson: separators must be a pair of strings");
  }
  o.sort_keys = flag(args.get(3, "sort_keys", k_false));
  return Value::string(to_json(operand, o));
}

Value map_filter(const Value& operand, const CallArgs& args) {
  std::vector<Value> out;
  const Value* attribute = nullptr;
  const Value* fallback = nullptr;
  for (const auto& [k, v] : args.kwargs) {
    if (k == "attribute") attribute = &v;
    if (k == "default") fallback = &v;
  }
  if (attribute) {
    for (const auto& item : iterate(operand)) {
      Value v = attr_path(item, *attribute);
      if (v.is_undefined() && fallback) v = *fallback;
      out.push_back(std::move(v));
    }
    return Value::list(std::move(out));
  }
  if (args.positional.empty()) throw EvalError("map: needs a filter name or attribute=");
  const std::string name = to_str(args.positional[0]);
  if (!is_known_filter(name)) throw EvalError("unsupported filter '" + name + "'");
  const CallArgs rest = shifted(args, 1);
  for (const auto& item : iterate(operand)) out.push_back(apply_filter(name, item, rest));
  return Value::list(std::move(out));
}

}  // namespace

bool is_known_filter(std::string_view name) {
  return std::find(k_filters.begin(), k_filters.end(), name) != k_filters.end();
}

Value apply_filter(const std::string& name, const Value& v, const CallArgs& args) {
  if (name == "length" || name == "count") return Value::integer(static_cast<int64_t>(length_of(v)));
  if (name == "tojson") return tojson(v, args);
  if (name == "string") return Value::string(to_str(v));
  if (name == "safe") return Value::string(to_str(v));
  if (name == "escape" || name == "e" || name == "forceescape") return Value::string(html_escape(to_str(v)));
  if (name == "lower") return Value::string(ascii_lower(to_str(v)));
  if (name == "upper") return Value::string(ascii_upper(to_str(v)));
  if (name == "title") return Value::string(jinja_title(to_str(v)));
  if (name == "capitalize") return Value::string(py_capitalize(to_str(v)));
  if (name == "trim") {
    const Value& chars = args.get(0, "chars", k_none);
    if (chars.is_none()) return Value::string(py_strip(to_str(v), nullptr, true, true));
    const std::string set = to_str(chars);
    return Value::string(py_strip(to_str(v), &set, true, true));
  }
  if (name == "default" || name == "d") {
    const Value empty = Value::string("");
    const bool boolean = flag(args.get(1, "boolean", k_false));
    if (v.is_undefined() || (boolean && !v.truthy())) return args.get(0, "default_value", empty);
    return v;
  }
  if (name == "first" || name == "last") {
    if (v.is_undefined()) return Value::undefined("No " + name + " item, sequence was undefined");
    const auto items = iterate(v);
    if (items.empty()) return Value::undefined("No " + name + " item, sequence was empty");
    return name == "first" ? items.front() : items.back();
  }
  if (name == "list") return Value::list(iterate(v));
  if (name == "items") {
    if (v.is_undefined()) return Value::list();
    if (!v.is(Kind::dict)) throw EvalError("Can only get item pairs from a mapping.");
    std::vector<Value> out;
    for (const auto& [k, val] : v.dict_data().items) out.push_back(Value::list({k, val}, true));
    return Value::list(std::move(out));
  }
  if (name == "dictsort") {
    if (!v.is(Kind::dict)) throw EvalError("dictsort: expected a mapping, got " + std::string(to_string(v.kind())));
    const bool cs = flag(args.get(0, "case_sensitive", k_false));
    const std::string by = to_str(args.get(1, "by", Value::string("key")));
    if (by != "key" && by != "value") throw EvalError("You can only sort by either 'key' or 'value'");
    const bool reverse = flag(args.get(2, "reverse", k_false));
    std::vector<Value> pairs;
    for (const auto& [k, val] : v.dict_data().items) pairs.push_back(Value::list({k, val}, true));
    return Value::list(sorted(std::move(pairs), Value::integer(by == "key" ? 0 : 1), cs, reverse));
  }
  if (name == "join") {
    const std::string sep = to_str(args.get(0, "d", Value::string("")));
    const Value& attribute = args.get(1, "attribute", k_none);
    std::string out;
    bool first = true;
    for (const auto& item : iterate(v)) {
      if (!first) out += sep;
      first = false;
      out += to_str(attribute.is_none() ? item : attr_path(item, attribute));
      check_string_size(out.size());
    }
    return Value::string(std::move(out));
  }
  if ((name == "int" || name == "float" || name == "indent" || name == "format") && v.is_undefined()) fail_undefined(v);
  if (name == "format") {
    if (!args.kwargs.empty()) throw EvalError("format: keyword arguments are unsupported");
    return Value::string(printf_format(to_str(v), args.positional));
  }
  if (name == "int") {
    const Value& fallback = args.get(0, "default", Value::integer(0));
    if (v.is(Kind::integer)) return v;
    if (v.is(Kind::boolean)) return Value::integer(v.as_bool() ? 1 : 0);
    if (v.is(Kind::floating)) {
      const double f = v.as_float();
      if (!std::isfinite(f) || std::fabs(f) >= 9.2e18) return fallback;
      return Value::integer(static_cast<int64_t>(f));
    }
    if (v.is_string()) {
      int64_t i = 0;
      if (parse_py_int(v.str(), i)) return Value::integer(i);
      double f = 0;
      if (parse_py_float(v.str(), f) && std::isfinite(f) && std::fabs(f) < 9.2e18) return Value::integer(static_cast<int64_t>(f));
    }
    return fallback;
  }
  if (name == "float") {
    const Value& fallback = args.get(0, "default", Value::floating(0.0));
    if (v.is_number()) return Value::floating(v.as_double());
    double f = 0;
    if (v.is_string() && parse_py_float(v.str(), f)) return Value::floating(f);
    return fallback;
  }
  if (name == "abs") {
    if (v.is(Kind::floating)) return Value::floating(std::fabs(v.as_float()));
    if (v.is(Kind::integer) || v.is(Kind::boolean)) {
      const int64_t i = v.is(Kind::boolean) ? (v.as_bool() ? 1 : 0) : v.as_int();
      if (i == INT64_MIN) throw EvalError("integer overflow");
      return Value::integer(i < 0 ? -i : i);
    }
    throw EvalError(std::string("bad operand type for abs(): '") + to_string(v.kind()) + "'");
  }
  if (name == "round") {
    return round_value(v, int_arg(args.get(0, "precision", Value::integer(0)), "precision"),
                       to_str(args.get(1, "method", Value::string("common"))));
  }
  if (name == "replace") {
    if (args.positional.size() < 2) throw EvalError("replace: needs old and new strings");
    const Value& count = args.get(2, "count", k_none);
    return Value::string(py_replace(to_str(v), to_str(args.positional[0]), to_str(args.positional[1]),
                                    count.is_none() ? -1 : int_arg(count, "count")));
  }
  if (name == "reverse") {
    if (v.is_string()) {
      const auto offs = utf8_offsets(v.str());
      std::string out;
      for (size_t i = offs.size() - 1; i > 0; --i) out.append(v.str(), offs[i - 1], offs[i] - offs[i - 1]);
      return Value::string(std::move(out));
    }
    auto items = iterate(v);
    std::reverse(items.begin(), items.end());
    return Value::list(std::move(items));
  }
  if (name == "sort") {
    return Value::list(sorted(iterate(v), args.get(2, "attribute", k_none), flag(args.get(1, "case_sensitive", k_false)),
                              flag(args.get(0, "reverse", k_false))));
  }
  if (name == "unique") {
    const bool cs = flag(args.get(0, "case_sensitive", k_false));
    const Value& attribute = args.get(1, "attribute", k_none);
    std::vector<Value> seen;
    std::vector<Value> out;
    for (const auto& item : iterate(v)) {
      Value key = sort_key(attribute.is_none() ? item : attr_path(item, attribute), cs);
      if (std::any_of(seen.begin(), seen.end(), [&](const Value& s) { return equals(s, key); })) continue;
      seen.push_back(std::move(key));
      out.push_back(item);
    }
    return Value::list(std::move(out));
  }
  if (name == "min" || name == "max") {
    const bool cs = flag(args.get(0, "case_sensitive", k_false));
    const Value& attribute = args.get(1, "attribute", k_none);
    const auto items = iterate(v);
    if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
    size_t best = 0;
    for (size_t i = 1; i < items.size(); ++i) {
      const Value a = sort_key(attribute.is_none() ? items[i] : attr_path(items[i], attribute), cs);
      const Value b = sort_key(attribute.is_none() ? items[best] : attr_path(items[best], attribute), cs);
      const int c = compare(a, b);
      if (name == "min" ? c < 0 : c > 0) best = i;
    }
    return items[best];
  }
  if (name == "sum") {
    const Value& attribute = args.get(0, "attribute", k_none);
    Value total = args.get(1, "start", Value::integer(0));
    for (const auto& item : iterate(v)) total = arithmetic("+", total, attribute.is_none() ? item : attr_path(item, attribute));
    return total;
  }
  if (name == "select" || name == "reject") return select_like(v, args, false, name == "select");
  if (name == "selectattr" || name == "rejectattr") return select_like(v, args, true, name == "selectattr");
  if (name == "map") return map_filter(v, args);
  if (name == "attr") {
    // jinja2's attr looks up attributes only, never mapping keys.
    if (args.positional.empty()) throw EvalError("attr: needs an attribute name");
    if (v.is_undefined()) fail_undefined(v);
    const std::string attr = to_str(args.positional[0]);
    if (auto m = lookup_method(v, attr)) return *m;
    if (v.is(Kind::ns) || v.is(Kind::object)) {
      if (const Value* found = v.dict_data().find(attr)) return *found;
    }
    return Value::undefined("object has no attribute '" + attr + "'");
  }
  if (name == "batch") {
    const int64_t n = int_arg(args.get(0, "linecount", k_undef), "linecount");
    if (n <= 0) throw EvalError("batch: linecount must be positive");
    const Value& fill = args.get(1, "fill_with", k_none);
    std::vector<Value> out;
    std::vector<Value> cur;
    for (const auto& item : iterate(v)) {
      cur.push_back(item);
      if (static_cast<int64_t>(cur.size()) == n) {
        out.push_back(Value::list(std::move(cur)));
        cur.clear();
      }
    }
    if (!cur.empty()) {
      if (!fill.is_none()) {
        while (static_cast<int64_t>(cur.size()) < n) cur.push_back(fill);
      }
      out.push_back(Value::list(std::move(cur)));
    }
    return Value::list(std::move(out));
  }
  if (name == "indent") {
    const Value& width = args.get(0, "width", Value::integer(4));
    const std::string ind = width.is_string() ? width.str()
                                              : std::string(static_cast<size_t>(std::clamp<int64_t>(int_arg(width, "width"), 0, 256)), ' ');
    const bool first = flag(args.get(1, "first", k_false));
    const bool blank = flag(args.get(2, "blank", k_false));
    const auto lines = split_lines(to_str(v) + "\n");
    std::string rv;
    if (blank) {
      for (size_t i = 0; i < lines.size(); ++i) {
        if (i) rv += "\n" + ind;
        rv += lines[i];
      }
    } else {
      rv = lines.empty() ? std::string() : lines[0];
      for (size_t i = 1; i < lines.size(); ++i) rv += "\n" + (lines[i].empty() ? lines[i] : ind + lines[i]);
    }
    if (first) rv = ind + rv;
    check_string_size(rv.size());
    return Value::string(std::move(rv));
  }
  throw EvalError("unsupported filter '" + name + "'");
}

}  // namespace servedeck::worker::tmpl
