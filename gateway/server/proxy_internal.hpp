// Internal to the streaming proxy (gateway/server/proxy.hpp): the ProxyCall class shared by its
// two translation units. proxy.cpp holds the call's life (start, the policy pipeline on the
// request, the upstream request, backpressure, heartbeats, writes to the client, the endings and
// the request-log row); proxy_engine_answer.cpp holds reading what the engine sends (SSE events,
// engine errors and the G09 retry, end of stream, the non-streaming body). Not part of the
// public API; include it from nowhere else.
//
// note: the class layout depends on SERVEDECK_HAVE_POLICIES, a PRIVATE definition of
// servedeck_gateway; every file that includes this header must be compiled in that target.
#pragma once

#include <utility>  // before Boost.Asio: boost 1.74 awaitable.hpp needs std::exchange

#include <chrono>
#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include <boost/asio.hpp>

#include "common/json_limits.hpp"
#include "common/openai_error.hpp"
#include "common/sse.hpp"
#include "gateway/server/engine_tokenize.hpp"
#include "gateway/server/proxy.hpp"
#include "gateway/server/stream_normalizer.hpp"
#include "gateway/server/upstream.hpp"
#ifdef SERVEDECK_HAVE_POLICIES
#include "policies/pipeline.hpp"
#include "policies/min_output_tokens.hpp"
#include "policies/capture.hpp"
#endif

namespace servedeck::gateway {

namespace asio = boost::asio;
using nlohmann::json;
using clock_type = std::chrono::steady_clock;

}  // namespace servedeck::gateway

namespace servedeck::gateway::detail {

constexpr std::size_t k_max_engine_body = 64u * 1024 * 1024;  // a non-streaming engine answer, bytes
// note: rendering and tokenizing a 30k-token prompt takes the worker well under a second; a
// /tokenize slower than this is given up and the prompt estimated instead.
constexpr int k_tokenize_timeout_ms = 10000;

// note: one event carries one delta; vLLM can send a tool call's whole arguments in one, so the
// bound is far above any real event (a 1 MiB file written by a tool is ~1 MiB), far below memory.
constexpr std::size_t k_max_engine_event = 16u * 1024 * 1024;  // one SSE event from the engine, bytes

inline double ms_since(clock_type::time_point t) {
  return std::chrono::duration<double, std::milli>(clock_type::now() - t).count();
}

/// One proxied completion, from start() to its one request-log row (proxy.hpp describes the
/// endings). Held by shared_ptr: the upstream callbacks, the heartbeat timer and the client's
/// disconnect callback each keep it alive. Every member after start() runs on `strand_`.
class ProxyCall : public std::enable_shared_from_this<ProxyCall> {
 public:
  ProxyCall(ProxyShared& shared, ProxyJob job);

  void start();

 private:
  StreamNormalizer::Options normalizer_options() const;

  void begin();
#ifdef SERVEDECK_HAVE_POLICIES
  /// The request policies, once the prompt's tokens are counted (or could not be).
  void apply_request_policies(TokenCount count);
#endif
  /// Everything after the policies: usage estimate, normaliser, heartbeats, the upstream call.
  void send_prepared();

#ifdef SERVEDECK_HAVE_POLICIES
  policies::RepairCounter repair_counter();
#endif

  void send_upstream();

  /// Backpressure: above k_high_water bytes queued for the client, stop reading the engine
  /// until the client took all but k_low_water.
  bool should_pause();

  // --- heartbeats: before the first output, and whenever nothing was written -----------
  /// Arms the heartbeat timer to fire `after` from now.
  void arm_heartbeat(std::chrono::milliseconds after);
  void on_heartbeat();
  void start_client_stream();
  void write_client(std::string_view bytes);

  // --- upstream data (proxy_engine_answer.cpp) -------------------------------------------
  static sse::Parser make_parser();
  void on_upstream_data(std::string_view bytes);
  /// The engine's final response head: its status, and a refusal of what this proxy cannot read
  /// (a Content-Encoding other than identity; a 200 to a streamed request that is not
  /// text/event-stream is read whole and answered at its end by not_sse_answer()).
  void on_upstream_head(int status, const std::map<std::string, std::string>& headers);
  /// The end of a 200 answer to a streamed request whose Content-Type was not text/event-stream:
  /// the engine's `{"error": …}` when the body is one, else a 502 `engine_bad_response` that names
  /// the Content-Type and quotes the body (cut at 200 bytes).
  void not_sse_answer();
  /// `at_end`: the event the engine left unterminated when it closed (a parse failure there is
  /// a stream cut inside an event, `upstream_closed`, not a malformed event).
  void handle_event(const sse::Event& ev, bool at_end = false);
  /// After the stream pipeline took a chunk: true when it found the answer unrepairable, and
  /// the call was ended with that error (the upstream cancelled).
  bool end_on_policy_error();
  /// Sends normalised output; a role-only prefix is held until the first real output.
  void deliver(std::string out);
  void on_engine_error(const json& err);
  static std::string engine_message(const json& err);
  static std::string engine_type(const json& err);
  static std::string engine_code(const json& err);
  /// The engine error's `param` when it is a string (cut at 256 bytes), else "".
  static std::string engine_param(const json& err);
  void finish_stream();
  void on_upstream_end(UpstreamFailure f, const std::string& detail);
  /// Starts the G09 retry's second attempt: fresh parser and normaliser, a new upstream call.
  void restart_attempt();
  /// When the engine went away because the slot is being switched or stopped (a drain that
  /// expired): ends the call with `model_switched` / `model_stopped` and returns true.
  bool fail_if_switched(const std::string& detail);
  /// The engine answered with a non-200 status: pass it on with source "engine".
  void answer_engine_error_body();
  /// A complete non-streaming answer from the engine.
  void answer_body();

  // --- endings ----------------------------------------------------------------------------
  /// An error: a real status when the client's stream has not started, else an error event.
  void fail(int status, const std::string& message, const std::string& type, const std::string& code,
            ErrorSource source, http::Headers extra_headers = {});
  void answer_local(int status, const std::string& message, const std::string& type, const std::string& code);
  void end_stream(std::string out);
  void on_client_gone();
  /// The call's one request-log row and metrics update; later calls do nothing.
  void record(int status);

 public:
  static void write_log(ProxyShared& shared, state::RequestRecord r);

 private:
  ProxyShared& shared_;
  ProxyJob job_;
  asio::strand<asio::io_context::executor_type> strand_;
  asio::steady_timer heartbeat_;
  std::shared_ptr<UpstreamCall> upstream_;
  json engine_body_;
  std::string engine_text_;       // non-streaming or error body from the engine
  std::string not_sse_type_;      // a streamed request's 200 answered with this media type, not SSE
  sse::Parser parser_ = make_parser();
  std::optional<StreamNormalizer> normalizer_;
  http::Headers client_headers_;  // added to the client's response (policies' notes)
#ifdef SERVEDECK_HAVE_POLICIES
  std::unique_ptr<policies::RequestContext> request_ctx_;
  std::unique_ptr<policies::ResponseContext> response_ctx_;
  std::optional<policies::StreamPipeline> stream_pipeline_;
#endif
  std::string held_;              // role-only output not yet sent (G09)
  std::optional<json> usage_;      // the engine's usage only (never a synthesised one): the log reads it
  int64_t prompt_estimate_ = -1;  // estimate_request_tokens(engine_body_), for a synthesised usage (G12)
  std::optional<double> ttft_ms_;
  std::string error_code_;
  std::string error_param_;  // the engine error's param, passed on in the client's envelope
  int upstream_status_ = 0;
  bool chat_ = true;
  bool stream_ = false;
  bool include_usage_ = false;
  bool client_started_ = false;
  bool retried_ = false;
  bool retrying_ = false;
  bool upstream_ended_ = false;     // on_end of the current attempt has run (cancel() is a no-op)
  int attempt_ = 0;
  bool done_ = false;               // the client's answer is complete (or the client is gone)
  bool progressed_ = false;         // since the upstream last asked: a data event (or body bytes) arrived
  bool recorded_ = false;           // record() ran
  clock_type::time_point last_write_ = clock_type::now();  // the last bytes written to the client
  bool capture_ = false;            // policies/capture.hpp: policy on and SERVEDECK_CAPTURE=1
  std::string captured_stream_;     // SSE bytes sent to the client (capture only), bounded
  json captured_body_;              // non-streaming body sent to the client (capture only)
};

}  // namespace servedeck::gateway::detail
