// Tool-call parsers: find tool-call markup in the content stream and turn it into tool-call
// deltas. Three formats:
//   hermes (Qwen2.5/Qwen3, Hermes):  <tool_call>\n{"name": "f", "arguments": {...}}\n</tool_call>
//   glm    (GLM-4.5 and later):      <tool_call>f\n<arg_key>k</arg_key>\n<arg_value>v</arg_value>\n…</tool_call>
//   qwen3_coder (Qwen3-Coder):       <tool_call>\n<function=f>\n<parameter=k>\nv\n</parameter>\n</function>\n</tool_call>
//                                    (worker/parsers/qwen3_coder_parser.hpp)
// Streaming-safe: text that may be the start of "<tool_call>" is held back; content around calls
// passes through. A hermes call written {"name": …, "arguments": {…}} (the usual order) starts as
// soon as its name is read and streams its arguments text as it arrives (a final "}" is held
// until it is known not to close the outer object); other shapes are emitted whole at the
// closing tag (start + one arguments delta). A glm call is emitted incrementally: start once the name line is complete,
// then one arguments fragment per completed <arg_key>/<arg_value> pair, then the closing "}".
// Markup that does not parse as a call is passed through as content, unchanged.
//
// GLM values: when the tool's JSON schema declares the parameter with a type other than "string",
// the value is parsed as JSON (kept as a string if it does not parse); otherwise it is a string.
//
// Not thread-safe: one parser per completion.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "worker/parsers/parse_delta.hpp"

namespace servedeck::worker {

enum class ToolParserKind { none, hermes, glm, qwen3_coder };

std::string_view to_string(ToolParserKind k);
/// "hermes" | "glm" | "qwen3_coder" | "none" (also "qwen3" → hermes, "glm45" / "glm4_moe" → glm,
/// "qwen3_xml" → qwen3_coder). False when unknown.
bool parse_tool_parser_kind(std::string_view s, ToolParserKind& out);

/// Produces tool-call ids ("call_…"). Default: "call_" + 24 random hex digits.
using ToolCallIdGenerator = std::function<std::string()>;
ToolCallIdGenerator random_tool_call_ids();

class ToolCallParser {
 public:
  virtual ~ToolCallParser() = default;
  /// Consumes content text; appends content and tool-call deltas.
  virtual void push(std::string_view text, std::vector<ParseDelta>& out) = 0;
  /// End of output: an unterminated call is completed if it parses, else released as content.
  virtual void finish(std::vector<ParseDelta>& out) = 0;
  /// Number of tool calls started so far.
  virtual int calls() const = 0;
};

/// `tools` is the request's "tools" array (OpenAI shape), used for GLM and Qwen3-Coder value
/// types; may be null.
/// kind none → a pass-through parser.
std::unique_ptr<ToolCallParser> make_tool_call_parser(ToolParserKind kind,
                                                      const nlohmann::json& tools,
                                                      ToolCallIdGenerator ids);

}  // namespace servedeck::worker
