// Bounds of one streamed answer, shared by every part that keeps a stream's text whole (the
// stream policies, the Messages and Responses bridges).
#pragma once

#include <cstddef>
#include <string>

namespace servedeck {

/// The most text (content, reasoning and tool-call arguments together, bytes) one streamed
/// answer may accumulate where a part keeps it whole. Past it the stream ends with an error
/// event naming the bound — never a silent cut. note: an answer is at most the model's context,
/// 400k tokens ≈ 2 MB of text on the largest served here, so 32 MiB is 16 times any real answer;
/// it stops an engine that streams without end before the copies the parts keep of it (the
/// policies, a bridge, the client's queue) cost more than about a GiB.
inline constexpr std::size_t k_max_stream_text_bytes = std::size_t{32} << 20;

/// The error's message: "the answer passed 32 MiB of text (content, reasoning and tool-call
/// arguments), the most one stream may hold (k_max_stream_text_bytes); it ends here rather than
/// be cut".
inline std::string stream_text_bound_message() {
  return "the answer passed " + std::to_string(k_max_stream_text_bytes >> 20) +
         " MiB of text (content, reasoning and tool-call arguments), the most one stream may hold "
         "(k_max_stream_text_bytes); it ends here rather than be cut";
}

}  // namespace servedeck
