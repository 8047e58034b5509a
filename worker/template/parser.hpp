// Parser of the chat-template interpreter: tokens -> syntax tree, following jinja2 3.1's
// grammar and operator precedence (lowest first): `x if c else y`, or, and, not,
// comparisons (chained, `in`, `not in`), `+ -`, `~`, `* / // %`, `**`, unary `- +`,
// postfix (`.attr`, `[key]`, `[a:b:c]`, call), filters `|f(...)` and tests `is [not] t`.
//
// Statements: if/elif/else, for (tuple targets, `if` filter, else), set (name, tuple,
// ns.attr, block set with filters), macro, call blocks, filter blocks, break/continue,
// raw, transformers' `{% generation %}` (rendered as its body). include/extends/import/
// block/with/do and other statements are TemplateErrors naming line:column.
#pragma once

#include <string_view>

#include "worker/template/ast.hpp"

namespace servedeck::worker::tmpl {

/// Parses `source` into statements. Throws TemplateError naming line:column. Nesting deeper
/// than 256 levels (expressions or blocks) is an error, not a stack overflow.
Body parse_template(std::string_view source);

}  // namespace servedeck::worker::tmpl
