// Builtin filters and tests of the chat-template interpreter, with jinja2 3.1 semantics
// (and transformers' own `tojson`: json.dumps(ensure_ascii=False, indent, separators,
// sort_keys), key order kept). The supported names are listed in docs/chat-templates.md;
// any other name is rejected when the template is parsed.
#pragma once

#include <string>
#include <string_view>

#include "worker/template/value.hpp"

namespace servedeck::worker::tmpl {

bool is_known_filter(std::string_view name);
bool is_known_test(std::string_view name);

/// `operand | name(args)`. Throws EvalError on a type or argument error.
Value apply_filter(const std::string& name, const Value& operand, const CallArgs& args);
/// `value is name(args)`. Throws EvalError on a type or argument error.
bool apply_test(const std::string& name, const Value& value, const CallArgs& args);

}  // namespace servedeck::worker::tmpl
