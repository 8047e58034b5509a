// answer_rescue (issue 7 §6; field case G16). Enabled by PolicyConfig::answer_rescue; counted as
// "answer_rescue".
//   - Reasoning that is the answer: finish "stop", no tool calls, empty content, non-empty
//     reasoning, and no closing think tag seen → the model never closed its think block and the
//     reasoning parser kept everything as reasoning: the text is moved to `content` (streams:
//     sent as one content delta before the finish chunk). Never for finish "length" (a budget
//     problem, min_output_tokens' business).
//   - A closing think tag inside `content` with no opening one ("…reasoning…</think>FINAL: B")
//     splits there: before → reasoning, after → content (non-streamed bodies).
//   - Tools offered, none returned, and a complete <tool_call>…</tool_call> block naming a
//     declared tool inside reasoning or content (hermes JSON, GLM arg_key or Qwen3-Coder <function=…> markup) → extracted as
//     a tool call, the block removed from the text, finish "tool_calls".
// Streams: content is passed on as it arrives (only a <tool_call> block naming a declared tool is
// held, from its opening tag: it may become a call) and the rescues happen at the end, with the
// finish chunk. While no reasoning has arrived, a stray </think> in the
// content is cut out (only a tail that could be the tag's start waits for the next delta, at most
// 7 bytes): the text before it was already sent as content and stays content, the answer after
// it follows a blank line.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace servedeck::policies {

/// Splits a stray closing think tag out of `content`: text before it is appended to `reasoning`
/// (trimmed), text after it (left-trimmed) stays as content. Returns true when it split.
bool split_stray_think(std::string& content, std::string& reasoning);

/// The condition for moving reasoning into content (see above).
bool reasoning_is_the_answer(std::string_view finish_reason, bool has_tool_calls, std::string_view content,
                             std::string_view reasoning, bool saw_think_close);

}  // namespace servedeck::policies
