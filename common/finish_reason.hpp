// Finish reasons that say an engine gave up on an answer rather than ended it: vLLM's and
// SGLang's "abort" (the request was aborted: a client gone, a preemption, a shutdown) and vLLM's
// "error". A chat client sees the engine's value as it is; the Responses and Messages bridges,
// which have no such value to pass on, end the stream with their failure event instead of
// response.completed or message_stop (docs/responses.md, docs/anthropic.md).
#pragma once

#include <string>
#include <string_view>

namespace servedeck {

/// True for a finish_reason that ends an answer unfinished by the engine's own account
/// ("abort", "error"); false for the endings OpenAI defines (stop, length, tool_calls,
/// content_filter, function_call) and for any other value.
inline bool finish_reason_is_failure(std::string_view reason) { return reason == "abort" || reason == "error"; }

/// The failure's message: "the engine ended the answer with finish_reason 'abort' (it gave up on
/// the request); the output so far is incomplete".
inline std::string finish_reason_failure_message(std::string_view reason) {
  return "the engine ended the answer with finish_reason '" + std::string(reason) +
         "' (it gave up on the request); the output so far is incomplete";
}

}  // namespace servedeck
