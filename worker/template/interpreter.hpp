// Evaluates a parsed chat template against a context (jinja2 scoping: for-loop iterations
// and macro calls get their own scope, `if` does not; namespaces carry state out of loops).
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "worker/template/ast.hpp"
#include "worker/template/chat_template.hpp"

namespace servedeck::worker::tmpl {

/// Renders `program` with `context` (a JSON object; its keys become variables shadowing the
/// builtins range, namespace, dict, raise_exception, strftime_now). Throws TemplateError
/// with the line:column of the failing node, or TemplateRaised.
std::string render_program(const Body& program, const nlohmann::ordered_json& context, const RenderLimits& limits);

/// Checks filter and test names against the builtins; throws TemplateError naming the first
/// unknown one ("unsupported filter 'wordwrap'") with its line:column.
void validate_program(const Body& program);

}  // namespace servedeck::worker::tmpl
