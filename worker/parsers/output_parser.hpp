// The whole output pipeline of a chat completion: reasoning split first, then tool-call parsing
// of the content (tool calls inside reasoning are not calls). Feed text pieces as the engine
// produces them; each push returns the deltas to stream. Folding every delta gives the
// non-streamed result (parse_whole()).
//
// Not thread-safe: one parser per completion.
#pragma once

#include <memory>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "worker/parsers/parse_delta.hpp"
#include "worker/parsers/reasoning_parser.hpp"
#include "worker/parsers/tool_call_parser.hpp"

namespace servedeck::worker {

struct OutputParserOptions {
  bool reasoning = false;            // --reasoning-parser qwen3 (true) | none (false)
  bool starts_in_reasoning = false;  // the prompt left a <think> block open
  ToolParserKind tool_parser = ToolParserKind::none;  // none also when the request has no tools
  nlohmann::json tools;              // the request's "tools" (for GLM value types)
  ToolCallIdGenerator ids;           // default: random "call_…" ids
};

class OutputParser {
 public:
  explicit OutputParser(OutputParserOptions options);

  /// Consumes a text piece; returns the deltas it completes (possibly none).
  std::vector<ParseDelta> push(std::string_view text);
  /// End of output: returns the deltas for everything held.
  std::vector<ParseDelta> finish();
  /// Tool calls started so far.
  int tool_calls() const { return tools_->calls(); }

 private:
  void route(std::vector<ParseDelta>& from_reasoning, std::vector<ParseDelta>& out);

  ReasoningParser reasoning_;
  std::unique_ptr<ToolCallParser> tools_;
};

/// Non-streamed parse of a complete text.
ParsedOutput parse_whole(std::string_view text, OutputParserOptions options);

}  // namespace servedeck::worker
