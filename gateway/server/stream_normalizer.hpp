// Stream normalisation: turns the chunk sequence an OpenAI-compatible engine streams into the
// shape real clients parse without breaking (issue 3 §4; field cases G10, G11, G20, G21, G23).
//
// What comes out, whatever came in:
//   - content/reasoning/tool-call chunks with `finish_reason: null`;
//   - exactly one finish chunk (empty delta) at the end, with `stop` or `tool_calls` supplied
//     when the engine never sent one (G21b), then the usage chunk only if the client asked
//     (`stream_options.include_usage`), then `data: [DONE]`;
//   - the usage chunk is the engine's usage unchanged when it sent one; when it sent none (older
//     llama-server builds, some vLLM paths) it is synthesised (G12; usage_estimate.hpp)
//     and marked `"servedeck_estimated"` / `"servedeck_usage_source"`, so exactly one usage
//     chunk comes whenever the client asked;
//   - optional fields that are null or empty (tool_calls, function_call, refusal, audio,
//     reasoning, reasoning_content, logprobs) omitted (G11);
//   - tool-call deltas: the first for an index carries a string id (`call_<hex>` generated when
//     the engine sent none, "", null or a number; stable for the stream), `type: "function"` and
//     the name; later deltas omit id, type and name (G10); a delta re-sending the complete
//     arguments already streamed (a JSON document) is not forwarded again;
//   - both `delta.reasoning` and `delta.reasoning_content` count as output; a reasoning-only
//     chunk is never dropped (G20);
//   - a stream with no content, reasoning or tool call at all ends with an error event, not
//     with [DONE];
//   - what it keeps per stream is bounded: the arguments of all tool calls together at
//     k_max_stream_text_bytes (common/stream_limits.hpp), k_max_stream_choices choices and
//     k_max_stream_tool_calls tool-call indexes per choice; past a bound the stream ends with a
//     `stream_too_large` error event naming it, never a silent cut.
// Also /v1/completions streams (`choices[].text`).
//
// Pure: no I/O, no clock. Not thread-safe (one per stream). Never throws on any input.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "common/openai_error.hpp"
#include "gateway/server/usage_estimate.hpp"

namespace servedeck::gateway {

/// The most choice indexes one normalised stream may carry (an engine answers n <= a few).
inline constexpr std::size_t k_max_stream_choices = 256;
/// The most tool-call indexes one choice of a normalised stream may carry.
inline constexpr std::size_t k_max_stream_tool_calls = 4096;

/// How a stream ended, as the normaliser saw it.
enum class StreamEnd { none, done, error };

class StreamNormalizer {
 public:
  struct Options {
    std::string model_id;        // echoed as every chunk's `model` (the id the client sent); "" keeps the engine's
    bool include_usage = false;  // the client asked for the usage chunk
    bool chat = true;            // chat.completion.chunk (false: text_completion)
    std::string id_seed;         // mixed into generated tool-call ids (e.g. the request id)
    /// Prompt tokens for a synthesised usage (G12) when the engine reports none:
    /// estimate_request_tokens(request body) on the proxy path; < 0: unknown (reported as 0).
    int64_t prompt_tokens_estimate = -1;
  };

  explicit StreamNormalizer(Options opt);

  /// One upstream chunk (a JSON object that is not an error). Appends zero or more SSE events
  /// to `out`. A non-object or a chunk without usable choices is dropped (usage kept): the proxy
  /// ends the stream on such chunks before they get here (engine_chunk.hpp).
  void on_chunk(const nlohmann::json& chunk, std::string& out);

  /// Upstream ended properly ([DONE], or closed after a finish chunk). Appends the finish
  /// chunk, the usage chunk when asked, and [DONE] — or, when nothing was produced, an
  /// "empty_stream" error event. Returns the ending written.
  StreamEnd finish(std::string& out);

  /// Appends an error event `data: {"error":{...}}` and no [DONE]. Idempotent per stream.
  void fail(std::string_view message, std::string_view type, std::string_view code, ErrorSource source,
            std::string& out);
  /// Appends an upstream error object (the value of an upstream `{"error":...}` event),
  /// normalised into the envelope with source "engine".
  void fail_with_engine_error(const nlohmann::json& error, std::string& out);

  /// True once anything beyond a role-only chunk was emitted (content, reasoning, tool call).
  bool produced_output() const { return produced_output_; }
  /// True once any event was emitted (including a role-only chunk).
  bool emitted_any() const { return emitted_any_; }
  /// True once the engine sent a finish_reason.
  bool finish_seen() const { return finish_reason_.has_value(); }
  StreamEnd ended() const { return ended_; }
  /// Non-empty once a chunk passed one of the bounds on what a stream keeps (the message names
  /// it); on_chunk then ended the stream with a `stream_too_large` error event.
  const std::string& bound_error() const { return bound_error_; }
  /// Usage as reported by the engine (the last non-null `usage`), if any. Never the synthesised
  /// one: the request log reads this, so an estimate is never logged as engine-reported.
  const std::optional<nlohmann::json>& usage() const { return usage_; }
  /// True once finish() wrote a synthesised usage chunk (the engine sent none, the client asked).
  bool usage_synthesized() const { return usage_synthesized_; }
  /// Number of chunks that carried output (an estimate of completion tokens when the engine
  /// reports no usage).
  int64_t output_chunks() const { return output_chunks_; }

  /// Normalises a non-streaming chat.completion / text_completion body in place: drops null or
  /// empty optional message fields (G11), gives tool calls string ids, sets `model`.
  /// Returns true when the body carries any content, reasoning or tool call.
  static bool normalize_body(nlohmann::json& body, std::string_view model_id, std::string_view id_seed);

  /// Non-streaming counterpart of the synthesised usage chunk (G12): when `body` (a
  /// chat.completion / text_completion object) has no usage object, adds one built by
  /// synthesize_usage() from the body's `timings` (llama-server), `prompt_tokens_estimate` and
  /// estimate_answer_tokens(body) (the answer's content, reasoning, tool-call names and arguments,
  /// or `text`). Returns true when it added one; a body with a usage object is untouched.
  static bool add_missing_usage(nlohmann::json& body, int64_t prompt_tokens_estimate);

 private:
  struct ToolState {
    bool header_sent = false;  // id and type sent
    bool name_sent = false;
    std::string arguments;     // accumulated argument text
  };
  struct ChoiceState {
    std::map<int64_t, ToolState> tools;  // by tool-call index
    bool any_tool = false;
    bool role_sent = false;
    std::optional<std::string> finish;   // the engine's finish_reason for this choice
  };

  void remember_meta(const nlohmann::json& chunk);
  nlohmann::json envelope() const;  // {id, object, created, model} for chunks we synthesise
  void emit(const nlohmann::json& chunk, std::string& out);
  bool normalize_tool_calls(int64_t choice_index, nlohmann::json& tool_calls);

  Options opt_;
  std::string id_;
  int64_t created_ = 0;
  std::string engine_model_;
  std::string system_fingerprint_;
  std::map<int64_t, ChoiceState> choices_;
  std::optional<std::string> finish_reason_;
  std::optional<nlohmann::json> usage_;
  std::optional<nlohmann::json> timings_;  // llama-server's `timings` object (last seen)
  bool usage_synthesized_ = false;
  bool produced_output_ = false;
  bool emitted_any_ = false;
  int64_t output_chunks_ = 0;
  std::size_t argument_bytes_ = 0;  // tool-call argument text kept, all choices
  std::string bound_error_;         // set when a chunk passed a bound; on_chunk ends the stream with it
  StreamEnd ended_ = StreamEnd::none;
};

/// `call_<24 hex>`: a stable id for tool call `index` of a stream seeded by `seed`.
std::string make_tool_call_id(std::string_view seed, int64_t choice, int64_t index);

}  // namespace servedeck::gateway
