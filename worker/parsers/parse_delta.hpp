// The unit the output parsers emit while a completion streams, and the folded (non-streamed)
// result. A stream of ParseDelta folds into ParsedOutput by concatenation: the non-streamed
// parse of a text is exactly the fold of the deltas streamed for it, however it was split.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace servedeck::worker {

enum class DeltaKind {
  content,              // answer text (delta.content)
  reasoning,            // text inside <think>…</think> (delta.reasoning_content)
  tool_call_start,      // a new tool call: tool_index, id, name (arguments come later)
  tool_call_arguments,  // a fragment of the tool call's JSON arguments text
};

std::string_view to_string(DeltaKind k);

struct ParseDelta {
  DeltaKind kind = DeltaKind::content;
  std::string text;     // content / reasoning / argument fragment
  int tool_index = -1;  // tool_call_*: 0-based index of the call in this completion
  std::string id;       // tool_call_start: "call_…"
  std::string name;     // tool_call_start: function name
};

struct ParsedToolCall {
  std::string id;
  std::string name;
  std::string arguments;  // JSON text of the arguments object
};

struct ParsedOutput {
  std::string content;
  std::string reasoning;
  std::vector<ParsedToolCall> tool_calls;
};

/// Folds deltas into `out` (appends).
void fold(const std::vector<ParseDelta>& deltas, ParsedOutput& out);

/// Appends a content/reasoning delta to `out`, merging with the previous delta of the same kind
/// (and dropping empty text).
void append_text(std::vector<ParseDelta>& out, DeltaKind kind, std::string_view text);

/// Length of the longest proper suffix of `buf` that is a prefix of `tag`: the bytes that must
/// be held back because the next piece may complete the tag. 0 when none.
std::size_t partial_tag_suffix(std::string_view buf, std::string_view tag);

}  // namespace servedeck::worker
