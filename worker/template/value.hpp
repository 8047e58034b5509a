// Runtime values of the chat-template interpreter, with Python/jinja2 semantics.
//
// A Value is one of: undefined, none, bool, int (int64), float (double), string (UTF-8),
// list (or tuple), dict (insertion-ordered), namespace, object (read-only attributes, e.g.
// `loop`) or function (builtin, macro, bound method). Strings, lists and dicts are held by
// shared pointer: copying a Value is cheap and, like Python, two copies of a list alias.
//
// Semantics follow CPython + jinja2 3.1 as transformers' apply_chat_template runs them:
// truthiness, == across int/float/bool, str() (None -> "None", True -> "True", containers
// -> repr), repr() of strings with single quotes. Python ints are unbounded; ours are int64
// and overflow is an error.
//
// Thread-safety: Values are not synchronised; one render uses its own values.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace servedeck::worker::tmpl {

/// An evaluation error without a source position; the interpreter adds line:column of the
/// node being evaluated and rethrows it as TemplateError.
struct EvalError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

enum class Kind { undefined, none, boolean, integer, floating, string, list, dict, ns, object, function };

/// Python type name of a kind, for error messages: "int", "str", "list", "dict", ...
const char* to_string(Kind kind);

class Value;
struct CallArgs;

struct ListData {
  std::vector<Value> items;
  bool is_tuple = false;
};

/// Insertion-ordered mapping; keys are Values (strings from JSON, anything hashable from
/// template literals). Lookup is linear: chat-template dicts are small.
struct DictData {
  std::vector<std::pair<Value, Value>> items;
  const Value* find(const Value& key) const;
  const Value* find(std::string_view key) const;
  void set(const Value& key, Value value);
};

/// A callable: builtin global, macro, bound method, loop.cycle.
struct FunctionData {
  std::string name;
  std::function<Value(CallArgs&)> call;
};

class Value {
 public:
  Value() = default;  // undefined
  static Value undefined(std::string name = {});
  static Value none();
  static Value boolean(bool b);
  static Value integer(int64_t i);
  static Value floating(double f);
  static Value string(std::string s);
  static Value list(std::vector<Value> items = {}, bool is_tuple = false);
  static Value dict();
  static Value ns();
  static Value object();
  static Value function(std::string name, std::function<Value(CallArgs&)> call);

  Kind kind() const { return kind_; }
  bool is(Kind k) const { return kind_ == k; }
  bool is_undefined() const { return kind_ == Kind::undefined; }
  bool is_none() const { return kind_ == Kind::none; }
  bool is_string() const { return kind_ == Kind::string; }
  bool is_number() const { return kind_ == Kind::integer || kind_ == Kind::floating || kind_ == Kind::boolean; }
  /// dict, namespace and object share DictData storage.
  bool has_attrs() const { return kind_ == Kind::dict || kind_ == Kind::ns || kind_ == Kind::object; }

  bool as_bool() const { return b_; }
  int64_t as_int() const { return i_; }
  double as_float() const { return f_; }
  /// Numeric value of bool/int/float as double.
  double as_double() const;
  const std::string& str() const { return *s_; }
  /// Name of the undefined variable ("" when unknown), for UndefinedError messages.
  const std::string& undefined_name() const { return *s_; }
  ListData& list_data() const { return *list_; }
  std::vector<Value>& items() const { return list_->items; }
  DictData& dict_data() const { return *dict_; }
  const FunctionData& fn() const { return *fn_; }
  const std::shared_ptr<ListData>& list_ptr() const { return list_; }
  const std::shared_ptr<DictData>& dict_ptr() const { return dict_; }

  /// Python truthiness: empty str/list/dict, 0, 0.0, None, undefined are false.
  bool truthy() const;

 private:
  Kind kind_ = Kind::undefined;
  bool b_ = false;
  int64_t i_ = 0;
  double f_ = 0.0;
  std::shared_ptr<const std::string> s_ = empty_string();
  std::shared_ptr<ListData> list_;
  std::shared_ptr<DictData> dict_;
  std::shared_ptr<FunctionData> fn_;
  static const std::shared_ptr<const std::string>& empty_string();
};

/// Arguments of a call: positional then keyword, in source order.
struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> kwargs;
  /// Argument `index` or keyword `name`, else `fallback` (a copy: callers often pass a
  /// temporary fallback).
  Value get(size_t index, std::string_view name, const Value& fallback) const;
  bool has(size_t index, std::string_view name) const;
};

/// Python `==` (int/float/bool compare numerically; lists and dicts element-wise;
/// undefined == undefined).
bool equals(const Value& a, const Value& b);

/// Python `str(v)`: strings as-is, None -> "None", True -> "True", floats as repr, lists and
/// dicts as repr, undefined -> "". Throws std::runtime_error past `max_depth` nesting.
std::string to_str(const Value& v);
/// Python `repr(v)`: strings quoted ('a', "it's"), otherwise like to_str.
std::string to_repr(const Value& v);
/// Python float repr: shortest round-trip digits, "1.0", "1e+16", "1e-05", "inf", "nan".
std::string float_repr(double f);

/// Number of Unicode code points in UTF-8 `s` (invalid bytes count one each).
size_t utf8_length(std::string_view s);
/// Byte offsets of each code point start in `s`, plus s.size() at the end.
std::vector<size_t> utf8_offsets(std::string_view s);

}  // namespace servedeck::worker::tmpl
