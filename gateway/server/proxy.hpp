// One proxied completion: client request → engine → client, streaming or not, with honest
// endings:
//   - the client's stream starts only with the first output (content, reasoning, tool call), so
//     an engine that fails first (HTTP error, an error event, nothing at all) gets a real error
//     status, not a 200 — unless `heartbeat_ms` passed first, when the stream starts with SSE
//     comment heartbeats and errors become error events; once started, a heartbeat is written
//     whenever nothing else was for `heartbeat_ms`;
//   - an engine error event after only the role chunk is retried once, transparently (G09);
//   - upstream closing before a finish chunk or [DONE], an error event mid-stream (G23), a
//     stream with no output, an event over k_max_engine_event bytes, or a tripped deadline → an
//     error event and no [DONE]; the non-streaming equivalents are 502 (engine fault), 504
//     (deadline) JSON bodies;
//   - a stream policy that finds the answer unrepairable ends the stream with its error at once
//     and cancels the upstream request;
//   - the engine going away because a switch (or stop) ended the drain → `model_switched`
//     (`model_stopped`), not `upstream_closed`;
//   - the client going away cancels the upstream request at once.
// Every call ends with exactly one request-log row (never bodies) and one metrics update; the
// in-flight gauge goes up once at start and down once at that row.
//
// Threading: a call runs on its own strand of the upstream io_context; the Responder is
// thread-safe. No exceptions on this path.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include <boost/asio/io_context.hpp>
#include <nlohmann/json.hpp>

#include "common/http/server.hpp"
#include "gateway/server/metrics.hpp"
#include "gateway/state/store.hpp"
#include "gateway/supervisor/slot_control.hpp"
#include "registry/model_entry.hpp"

namespace servedeck::policies {
class ReasoningStore;
}

namespace servedeck::gateway {

/// The client-facing route. `responses` and `messages` are the Responses and Anthropic Messages
/// bridges: proxied upstream as chat completions (gateway/responses, gateway/anthropic translate
/// both ways) and logged under /v1/responses and /v1/messages.
enum class Route { chat_completions, completions, responses, messages };
/// The path the client called, as logged ("/v1/responses" for the bridge).
std::string_view route_path(Route r);
/// The engine path a route is proxied to ("/v1/chat/completions" for the bridge).
std::string_view upstream_path(Route r);

/// What every call shares; owned by the Gateway.
struct ProxyShared {
  boost::asio::io_context* upstream_ioc = nullptr;
  Metrics* metrics = nullptr;
  state::Store* store = nullptr;
  /// Runs `fn` off the I/O threads (request-log writes); runs it inline when it returns false.
  std::function<bool(std::function<void()>)> post_blocking;
  int heartbeat_ms = 5000;                        // SSE comment heartbeat after this long without a write
  int retry_after_s = 30;                         // Retry-After on a 503 the call answers itself
  policies::ReasoningStore* reasoning_store = nullptr;
  SlotControl* slots = nullptr;                   // engine stopped by a switch vs a crash; missed first-byte deadlines
};

/// One request, resolved and admitted (the model is running and `lease` holds it).
struct ProxyJob {
  Route route = Route::chat_completions;
  const registry::ModelEntry* model = nullptr;    // base model
  const registry::EffortPreset* preset = nullptr; // when the id is a preset alias
  std::string requested_id;                       // the `model` the client sent
  nlohmann::json body;                            // the client's body, parsed (an object)
  std::string engine_host;
  int engine_port = 0;
  Lease lease;
  std::shared_ptr<http::Responder> res;
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
  bool client_stream_started = false;             // heartbeats were already sent while queued
};

/// Starts the call; returns at once.
void start_proxy(ProxyShared& shared, ProxyJob job);

/// Logs and counts a request the gateway answered itself without reaching an engine
/// (401/400/404/409/413/503...). Never throws.
void record_local_answer(ProxyShared& shared, Route route, const std::string& model, const std::string& alias,
                         bool stream, int status, const std::string& error_code,
                         std::chrono::steady_clock::time_point start);

}  // namespace servedeck::gateway
