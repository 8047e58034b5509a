// Per-model policies: request transforms and response transforms (whole bodies and streamed
// chunks), configured per model in models.toml ([models.X.policies]). One file per policy under
// policies/; this header is the interface the gateway calls. See docs/policies.md.
//
// Order on a chat completion (the gateway calls these in this order):
//   request:  RequestPipeline::apply()            (client body → engine body)
//   response: ResponsePipeline::apply_body()      (non-streaming engine body → client body)
//             StreamPipeline::on_chunk()/finish() (each streamed chunk → zero or more chunks)
// The gateway's own stream normalisation (one finish chunk, [DONE], ids) runs after the
// policies, so policies may emit chunks in any OpenAI-valid shape.
//
// Work: each pipeline grants its context's WorkBudget (work_budget.hpp) the text bytes of what it
// is given (the request body, the response body, each chunk), and every repair charges it; a
// request whose policies spend it ends with an error naming the limit (code
// policy_work_budget_exceeded), never a stuck thread.
//
// Thread-safety: pipelines are built per request and used from one thread at a time. The
// reasoning store (restore_reasoning) is shared and internally synchronised.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "policies/work_budget.hpp"
#include "registry/model_entry.hpp"

namespace servedeck::policies {

/// Called once per repair: policy name ("sanitize_tool_tags", ...) and the base model name.
/// The gateway exports these as servedeck_policy_repairs_total{policy,model}.
using RepairCounter = std::function<void(std::string_view policy, std::string_view model)>;

class ReasoningStore;  // policies/restore_reasoning.hpp

/// What a request pipeline knows about the request it transforms.
struct RequestContext {
  const registry::ModelEntry* model = nullptr;    // resolved base model (never null)
  std::string requested_id;                       // the `model` the client sent (served name or alias)
  const registry::EffortPreset* preset = nullptr; // non-null when requested_id is a preset alias
  std::optional<int64_t> prompt_tokens;           // set by the gateway when wants_prompt_tokens()
  bool prompt_tokens_estimated = false;           // true when prompt_tokens is an estimate, not /tokenize
  RepairCounter count_repair;
  ReasoningStore* reasoning_store = nullptr;      // shared, may be null when restore_reasoning is off
  std::vector<std::string> log;                   // notes the gateway writes to its log ("min_output_tokens: 200 → 8192")
  /// Headers the gateway adds to the client's response (name, value), e.g. fit_output_budget's
  /// "x-servedeck-output-budget".
  std::vector<std::pair<std::string, std::string>> response_headers;
  WorkBudget budget;                              // granted by apply() from the body's size
};

/// The request side. Construct per request.
class RequestPipeline {
 public:
  explicit RequestPipeline(RequestContext& ctx);

  /// True when a configured policy needs the prompt's token count (min_output_tokens with a
  /// budget below its floor, or fit_output_budget with a budget that may not fit the context).
  /// The gateway then fills ctx.prompt_tokens before apply().
  bool wants_prompt_tokens(const nlohmann::json& body) const;

  /// Applies every configured request policy to a /v1/chat/completions body in place.
  /// Returns an error message (client's fault, HTTP 400) or nullopt; a spent work budget is
  /// such an error (WorkBudget::message()), and the body is then partly transformed.
  std::optional<std::string> apply(nlohmann::json& body);

 private:
  RequestContext& ctx_;
};

/// What a response pipeline knows: the (transformed) request it answers.
struct ResponseContext {
  const registry::ModelEntry* model = nullptr;
  std::string requested_id;          // echoed as the response's `model`
  nlohmann::json request;            // the body sent to the engine (tools, tool_choice, ...)
  RepairCounter count_repair;
  ReasoningStore* reasoning_store = nullptr;
  WorkBudget budget;                 // granted per body or chunk; shared by a stream's chunks
};

/// A policy verdict that the response must not reach the client as is (e.g. a tool call with
/// required parameters and `{}` arguments that could not be recovered, G03).
struct PolicyError {
  std::string message;
  std::string code;                  // e.g. "tool_call_unrecoverable"
};

/// Non-streaming responses.
class ResponsePipeline {
 public:
  explicit ResponsePipeline(ResponseContext& ctx);
  /// Transforms a chat.completion body in place. Returns an error when the response cannot
  /// be repaired into something valid, or its repair spent the work budget (code
  /// policy_work_budget_exceeded); the gateway answers 502 with it.
  std::optional<PolicyError> apply_body(nlohmann::json& body);

 private:
  ResponseContext& ctx_;
};

/// The `code` of the error a stream gets when its text passes k_max_stream_text_bytes
/// (common/stream_limits.hpp): the pipeline keeps a stream's text whole for its repairs.
inline constexpr std::string_view k_stream_too_large_code = "stream_too_large";

/// Streaming responses: stateful per stream. The text bytes of a stream's chunks
/// (json_text_bytes) are bounded by k_max_stream_text_bytes: past it error() is set with code
/// k_stream_too_large_code.
class StreamPipeline {
 public:
  explicit StreamPipeline(ResponseContext& ctx);
  ~StreamPipeline();
  StreamPipeline(StreamPipeline&&) noexcept;

  /// One upstream chat.completion.chunk in; the chunks to send on (possibly none while a
  /// fragment is held back, possibly several).
  std::vector<nlohmann::json> on_chunk(const nlohmann::json& chunk);

  /// Upstream ended properly ([DONE] or finish seen). Returns chunks still held back, or an
  /// error when the stream cannot be completed validly (G05: finish tool_calls with no call).
  std::vector<nlohmann::json> finish(std::optional<PolicyError>& error);

  /// Set as soon as the stream is known to be unrepairable (e.g. a tool name that matches no
  /// declared tool, G04): the gateway may stop reading and end with an error event. While set,
  /// on_chunk withholds the finish chunk; finish() reports the same error.
  const std::optional<PolicyError>& error() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
  ResponseContext* ctx_;
};

}  // namespace servedeck::policies
