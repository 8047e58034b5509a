// The shape the gateway accepts for one parsed event of an engine's stream, checked once in the
// proxy before anything reads the event (the response policies, the stream normaliser, the
// Responses and Messages bridges), so no later reader has to guess at a malformed one.
//
// Accepted (what vLLM, SGLang and llama-server send):
//   - a JSON object without `choices` (a usage-only or timings-only tail some builds send): its
//     usage and timings are kept, nothing is forwarded;
//   - a JSON object whose `choices` is an array (empty for the usage chunk) of objects, where
//     a choice's `index`, when present, is an integer in [0, n) (n: the request's `n`, default 1),
//     and, on chat streams, a tool-call delta's `index` (`choices[i].delta.tool_calls[j].index`),
//     when present, is an integer in [0, k_max_stream_tool_calls).
// Anything else — an array, a number, a string, null, a `choices` that is not an array, a choice
// that is not an object, an index that is negative, past its range, fractional, written as a
// float (1e18) or not a number — is an `engine_bad_event`: the stream ends with an error naming
// the field, what was read (quoted with log_safe, cut at k_max_quoted_event_bytes) and what was
// expected. Events that are `{"error": ...}` objects are the proxy's to handle before this check.
//
// Pure: no I/O. Thread-safe (no state). Never throws.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

namespace servedeck::gateway {

/// Bytes of an engine value quoted in an `engine_bad_event` message; a longer one is cut ("…").
inline constexpr std::size_t k_max_quoted_event_bytes = 200;

/// What the request asked for, against which an engine chunk is checked.
struct EngineChunkShape {
  int64_t choices = 1;  // the request's `n`: a choice index lies in [0, choices)
  bool chat = true;     // a chat.completion.chunk stream (false: text_completion, no tool calls)
};

/// The number of choices a completion request asks for: its `n` when that is a positive integer,
/// else 1 (the API's default; a non-positive or non-integer `n` is the engine's to refuse).
int64_t requested_choices(const nlohmann::json& request);

/// Empty when `chunk` (a parsed engine event that is not an `{"error": ...}` object) has the
/// accepted shape above; else the message of the `engine_bad_event` error, e.g.
/// `the engine sent choices[0].index = '-7' (number); expected an integer in [0, 1) (the request's n)`.
std::string engine_chunk_error(const nlohmann::json& chunk, const EngineChunkShape& shape);

}  // namespace servedeck::gateway
