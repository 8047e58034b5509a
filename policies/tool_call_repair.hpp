// tool_call_repair: tool calls that would reach the client invalid (docs/field-cases.md: G03,
// G04, G05, G07). Enabled per model by `tool_call_repair` (PolicyConfig::extra["tool_call_repair"],
// default: on when sanitize_tool_tags or coerce_tool_argument_types is on); G07 by
// coerce_tool_argument_types. Counter policy name "tool_call_repair".
//
//   G03  a tool with required parameters called with `{}` arguments → recover the arguments from
//        the raw markup in content/reasoning (tolerant: a missing `<arg_value>` is fine), else
//        PolicyError "tool_call_unrecoverable". Never forward `{}` for such a tool.
//   G04  name = declared tool + one of its parameter names ("send_command_to_shellcommand") →
//        split into the tool; arguments that are not a JSON object become {param: text}. A name
//        that matches no declared tool is never emitted (PolicyError "tool_call_unknown_name").
//   G05  finish `tool_calls` with no tool call → recover the call from raw text, else
//        PolicyError "tool_call_missing".
//   G07  values coerced to the declared JSON-schema types at the end of each call (see
//        ArgumentRepair, option coerce).
//
// Pure functions; thread-safe. Each takes the request's WorkBudget (optional) and charges it the
// bytes it scans and the tools it visits; with the budget spent it finds nothing.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "policies/tool_schema.hpp"
#include "policies/work_budget.hpp"
#include "registry/model_entry.hpp"

namespace servedeck::policies {

/// Whether G03/G04/G05 repair is on: extra["tool_call_repair"] when it is a boolean, else
/// sanitize_tool_tags || coerce_tool_argument_types.
bool tool_call_repair_enabled(const registry::PolicyConfig& config);

/// A fresh tool-call id, "call_" + 24 hex digits.
std::string new_tool_call_id();

/// The outcome of checking a tool call's name against the declared tools.
struct NameResolution {
  std::string name;                     // the name to emit (declared)
  std::optional<std::string> split_param;  // G04: the parameter name that was glued on
  bool sanitized = false;               // markup stripped from the name (sanitize_tool_tags)
  std::optional<std::string> error;     // matches no declared tool
};

/// Resolves `name` against `tools` (which must be non-empty): exact match; markup stripped
/// (when `sanitize`); declared tool + parameter name, optionally joined by '_', '-' or '.'
/// (G04, only when exactly one split fits).
NameResolution resolve_tool_name(std::string_view name, const std::vector<DeclaredTool>& tools, bool sanitize,
                                 WorkBudget* budget = nullptr);

/// G04 arguments after a split: a JSON object stays as it is; empty text becomes "{}"; any other
/// text (or JSON scalar) becomes {param: value typed by the schema}.
std::string arguments_after_split(std::string_view arguments, const DeclaredTool& tool, const std::string& param,
                                  WorkBudget* budget = nullptr);

/// True when `arguments` is empty, whitespace, or an empty JSON object.
bool is_empty_arguments(std::string_view arguments, WorkBudget* budget = nullptr);

/// Required parameters of `tool` missing from `arguments` (all of them when it does not parse).
std::vector<std::string> missing_required(std::string_view arguments, const DeclaredTool& tool,
                                          WorkBudget* budget = nullptr);

/// A tool call read out of free text.
struct RecoveredCall {
  std::string name;
  std::string arguments;   // JSON object text
  std::size_t begin = 0;   // the markup's range in the text searched
  std::size_t end = 0;
};

/// Finds a tool call in `text`: a complete `<tool_call>…</tool_call>` block (hermes JSON, GLM or
/// Qwen3-Coder XML markup: markup::parse_block_body) naming a declared tool, or — when `name` is given — that name followed by GLM argument
/// markup without the block tags. Only calls whose arguments carry every required parameter
/// count. `name` restricts the search to that tool.
std::optional<RecoveredCall> recover_call(std::string_view text, const std::vector<DeclaredTool>& tools,
                                          std::optional<std::string_view> name = std::nullopt,
                                          WorkBudget* budget = nullptr);

/// Every complete block in `text` naming a declared tool (answer rescue), in order.
std::vector<RecoveredCall> extract_calls(std::string_view text, const std::vector<DeclaredTool>& tools,
                                         WorkBudget* budget = nullptr);

/// Removes the ranges of `calls` (from `text`) and trims the result.
std::string remove_ranges(std::string_view text, const std::vector<RecoveredCall>& calls);

}  // namespace servedeck::policies
