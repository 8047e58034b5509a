// Builtin tests (`x is defined`, `x is divisibleby 3`, ...), jinja2 3.1 semantics.
#include <algorithm>
#include <array>
#include <cmath>

#include "worker/template/filters.hpp"
#include "worker/template/ops.hpp"
#include "worker/template/string_util.hpp"

namespace servedeck::worker::tmpl {

namespace {

constexpr std::array<std::string_view, 40> k_tests = {
    "boolean", "callable", "defined", "divisibleby", "eq", "equalto", "==", "escaped", "even", "false",
    "filter", "float", "ge", ">=", "gt", "greaterthan", ">", "in", "integer", "iterable",
    "le", "<=", "lower", "lt", "lessthan", "<", "mapping", "ne", "!=", "none",
    "number", "odd", "sameas", "sequence", "string", "test", "true", "undefined", "upper", "divisible_by"};

const Value& arg(const CallArgs& args, const std::string& test) {
  if (args.positional.empty()) throw EvalError("test '" + test + "' needs an argument");
  return args.positional[0];
}

double remainder_of(const Value& v, const Value& by) {
  if (v.is_undefined()) fail_undefined(v);
  if (!v.is_number() || !by.is_number()) {
    throw EvalError(std::string("unsupported operand type(s) for %: '") + to_string(v.kind()) + "' and '" +
                    to_string(by.kind()) + "'");
  }
  const Value r = arithmetic("%", v, by);
  return r.as_double();
}

}  // namespace

bool is_known_test(std::string_view name) {
  return std::find(k_tests.begin(), k_tests.end(), name) != k_tests.end();
}

bool apply_test(const std::string& name, const Value& v, const CallArgs& args) {
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "boolean") return v.is(Kind::boolean);
  if (name == "true") return v.is(Kind::boolean) && v.as_bool();
  if (name == "false") return v.is(Kind::boolean) && !v.as_bool();
  if (name == "integer") return v.is(Kind::integer);
  if (name == "float") return v.is(Kind::floating);
  if (name == "number") return v.is_number();
  if (name == "string") return v.is_string();
  if (name == "mapping") return v.is(Kind::dict);
  if (name == "iterable") return v.is_undefined() || v.is_string() || v.is(Kind::list) || v.is(Kind::dict);
  if (name == "sequence") return v.is_undefined() || v.is_string() || v.is(Kind::list) || v.is(Kind::dict);
  if (name == "callable") return v.is(Kind::function) || v.is_undefined();
  if (name == "escaped") return false;
  if (name == "odd") return remainder_of(v, Value::integer(2)) != 0.0;
  if (name == "even") return remainder_of(v, Value::integer(2)) == 0.0;
  if (name == "divisibleby" || name == "divisible_by") return remainder_of(v, arg(args, name)) == 0.0;
  if (name == "lower" || name == "upper") {
    const std::string s = to_str(v);
    return py_is(s, name == "lower" ? "islower" : "isupper");
  }
  if (name == "eq" || name == "equalto" || name == "==") return equals(v, arg(args, name));
  if (name == "ne" || name == "!=") return !equals(v, arg(args, name));
  if (name == "lt" || name == "lessthan" || name == "<") return compare(v, arg(args, name)) < 0;
  if (name == "le" || name == "<=") return compare(v, arg(args, name)) <= 0;
  if (name == "gt" || name == "greaterthan" || name == ">") return compare(v, arg(args, name)) > 0;
  if (name == "ge" || name == ">=") return compare(v, arg(args, name)) >= 0;
  if (name == "in") return contains(arg(args, name), v);
  if (name == "sameas") {
    const Value& o = arg(args, name);
    if (v.kind() != o.kind() || v.is_undefined()) return false;
    if (v.is(Kind::list)) return v.list_ptr() == o.list_ptr();
    if (v.has_attrs()) return v.dict_ptr() == o.dict_ptr();
    if (v.is(Kind::function)) return &v.fn() == &o.fn();
    return equals(v, o);
  }
  if (name == "filter") return v.is_string() && is_known_filter(v.str());
  if (name == "test") return v.is_string() && is_known_test(v.str());
  throw EvalError("unsupported test '" + name + "'");
}

}  // namespace servedeck::worker::tmpl
