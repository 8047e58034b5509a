// OpenAI chat `tool_choice`, enforced without a grammar engine by forcing the start of the
// assistant's answer (as several engines do): the forced text is appended to the prompt tokens
// and fed to the output parser as if the model had generated it.
//
//   absent / null / "auto"  → nothing forced; tools as the model likes
//   "none"                  → nothing forced; the tool-call parser is off
//   "required"              → the answer opens a tool call: hermes and qwen3_coder "<tool_call>\n",
//                             glm "<tool_call>"
//   {"type": "function", "function": {"name": "X"}}
//                           → the answer opens a call to X: hermes
//                             `<tool_call>\n{"name": "X", "arguments": {`, glm "<tool_call>X\n",
//                             qwen3_coder "<tool_call>\n<function=X>\n"
//
// Only the opening is forced: the arguments are whatever the model generates next (not
// validated against the tool's schema), and a model may still close the call badly (the parser
// then releases the markup as content, as for any malformed call).
//
// Reasoning: required/named skip it. The forced text follows the generation prompt directly;
// when the prompt leaves a <think> block open, the forced text first closes it with
// "</think>\n\n" (the empty block Qwen3's template writes for enable_thinking=false), so the
// call is content, never reasoning.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "worker/parsers/tool_call_parser.hpp"

namespace servedeck::worker {

enum class ToolChoiceMode { automatic, none, required, named };

/// "auto" | "none" | "required" | "named".
std::string_view to_string(ToolChoiceMode m);

struct ToolChoice {
  ToolChoiceMode mode = ToolChoiceMode::automatic;
  std::string name;  // named: the function to call (one of the request's tools)
};

/// Why a tool_choice is refused (the 400's OpenAI `code`; its `param` is "tool_choice"):
///   invalid     → "invalid_tool_choice": the value is malformed or does not fit the request
///                 (unknown string, wrong shape, "required"/named without tools, unknown name)
///   unsupported → "unsupported_tool_choice": a well-formed choice this worker cannot enforce for
///                 the model's tool-call format (--tool-parser none, a name glm cannot write)
enum class ToolChoiceErrorKind { invalid, unsupported };

/// "invalid_tool_choice" | "unsupported_tool_choice".
std::string_view to_string(ToolChoiceErrorKind k);

/// A refused tool_choice: the kind (→ code) and a message naming what was read and what is expected.
struct ToolChoiceError {
  ToolChoiceErrorKind kind = ToolChoiceErrorKind::invalid;
  std::string message;
};

/// Reads body["tool_choice"] against `tools` (the request's non-empty "tools" array, or null when
/// none). Returns nullopt and fills `out`, or an `invalid` error whose message names what was
/// read and what is expected: an unknown string, a non-string non-object, an object not shaped
/// {"type": "function", "function": {"name": "..."}}, "required" or a named function without
/// tools, a name that is not one of the tools (the message lists the tools' names).
std::optional<ToolChoiceError> parse_tool_choice(const nlohmann::json& body, const nlohmann::json& tools,
                                                 ToolChoice& out);

/// The text forced at the start of the answer for `choice` in the model's tool-call format
/// `kind` ("" for auto and none); `prompt_opens_reasoning` prepends "</think>\n\n" (required and
/// named only). Returns nullopt and fills `prefix`, or an `unsupported` error when `kind` cannot
/// force it (none: "tool_choice 'required' is not supported for this model's tool-call format ...";
/// glm, qwen3_coder: a function name the format cannot write).
std::optional<ToolChoiceError> forced_tool_call_prefix(const ToolChoice& choice, ToolParserKind kind,
                                                       bool prompt_opens_reasoning, std::string& prefix);

}  // namespace servedeck::worker
