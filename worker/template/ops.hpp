// Operations on template values with jinja2 (sandboxed, as transformers runs it) and Python
// semantics: attribute and item lookup, iteration, ordering, membership, arithmetic,
// slicing, JSON in and out. All throw EvalError (no position) on a Python TypeError /
// ValueError / UndefinedError equivalent; the interpreter adds line:column.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "worker/template/value.hpp"

namespace servedeck::worker::tmpl {

/// Bytes any one string value may reach (output, concatenation, repetition); past it the
/// render fails instead of exhausting memory. Set per render by the interpreter.
void set_max_string_bytes(size_t bytes);
size_t max_string_bytes();
/// Throws EvalError when `size` exceeds max_string_bytes().
void check_string_size(size_t size);

/// Throws the UndefinedError of an undefined value ("'x' is undefined").
[[noreturn]] void fail_undefined(const Value& v);

/// `obj.name`: a method (bound function) first, then a mapping key / namespace attribute;
/// an undefined value naming what is missing when neither exists. Undefined `obj` throws.
Value get_attr(const Value& obj, const std::string& name);
/// `obj[key]`: item first (int index, negative from the end; slice; mapping key), then
/// attribute for string keys; undefined when missing. Undefined `obj` throws.
Value get_item(const Value& obj, const Value& key);
/// Python slice `obj[start:stop:step]` of a list/tuple or string (by code point).
Value slice_value(const Value& obj, std::optional<int64_t> start, std::optional<int64_t> stop,
                  std::optional<int64_t> step);

/// Bound method `name` of a str, dict or list, if Python has it and we support it.
std::optional<Value> lookup_method(const Value& obj, const std::string& name);

/// Items of `for x in v` / list(v): list items, dict keys, string code points; undefined
/// iterates empty. Anything else throws "'int' object is not iterable".
std::vector<Value> iterate(const Value& v);
/// Python ordering: -1, 0, 1. Numbers with numbers, str with str, list with list.
int compare(const Value& a, const Value& b);
/// Python `item in container`.
bool contains(const Value& container, const Value& item);
/// Python `a <op> b` for op in + - * / // % **.
Value arithmetic(const std::string& op, const Value& a, const Value& b);

/// Python printf-style `fmt % args` for %s %r %d %i %x %o %f %e %g %% with flags, width
/// and precision on numbers; named fields and widths on %s are errors.
std::string printf_format(const std::string& fmt, const std::vector<Value>& args);

/// JSON (nlohmann ordered_json, key order kept) -> Value. Nesting deeper than 256 levels
/// throws EvalError.
Value from_json(const nlohmann::ordered_json& j);
Value from_json_at(const nlohmann::ordered_json& j, int depth);

/// Python json.dumps(v, ensure_ascii, indent, separators, sort_keys) as transformers' tojson
/// filter calls it. `indent` empty = single line; item/key separators default to
/// (", ", ": ") without indent and (",", ": ") with it.
struct JsonOptions {
  bool ensure_ascii = false;
  std::optional<std::string> indent;
  std::optional<std::pair<std::string, std::string>> separators;
  bool sort_keys = false;
};
std::string to_json(const Value& v, const JsonOptions& options);

}  // namespace servedeck::worker::tmpl
