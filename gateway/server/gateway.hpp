// The gateway: the daemon's HTTP front (OpenAI-compatible routes, /health, /metrics) and the
// streaming proxy to the engine of the ready slot. Admin routes are registered by the daemon
// (gateway/admin) through add_route(). See docs/gateway.md.
//
// Routes: POST /v1/chat/completions, POST /v1/completions (gateway/server/proxy.hpp),
// GET /v1/models (every configured id with its own context), GET /health, GET /metrics
// (gateway/server/metrics.hpp), plus add_route() routes (the admin plane, under /admin). Every
// request is first checked from its head alone, before its body is read (gateway/server/access.hpp):
// Host and Origin, the admin token on /admin routes, `server.api_keys` on the data-plane routes
// (every route but /health and /admin), and Content-Type application/json on POST.
//
// Routing: the request's `model` (served name, alias or preset alias) → its base model. When
// that model holds the ready slot the request is proxied under a lease. Otherwise: with
// `switch_on_request` the request waits (bounded by queue_max and queue_timeout_s; streaming
// clients get SSE comment heartbeats) while SlotControl::ensure_running switches; without it,
// 409 naming the running model and `servedeck switch <name>` (and, when the last switch to that
// model was refused by preflight before the stop, the refused checks: SlotSnapshot::refusal).
//
// Thread-safety: add_route() before start(); everything else from any thread.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "common/http/server.hpp"
#include "gateway/state/store.hpp"
#include "gateway/supervisor/slot_control.hpp"
#include "registry/model_entry.hpp"

namespace servedeck::policies {
class ReasoningStore;  // policies/restore_reasoning.hpp
}

namespace servedeck::gateway {

class Metrics;  // gateway/server/metrics.hpp

struct GatewayOptions {
  std::string host = "127.0.0.1";
  int port = 0;                // 0 = ephemeral
  int threads = 2;             // HTTP I/O threads; as many again run the upstream connections
  int heartbeat_ms = 5000;     // SSE comment heartbeat interval to a streaming client that waits
                               // (queued for a switch, or before the engine's first token)
  int retry_after_s = 30;      // Retry-After on 503 (queue full, queue timeout, model loading)
  std::string admin_token;     // bearer token of the /admin routes; empty = admin plane closed (403)
  std::string admin_token_path;  // the file the CLI reads it from (named in 401 messages)
  /// Client connections at once; above → 503 too_many_connections. `servedeck serve` fits it to
  /// the descriptor limit (descriptor_limit.hpp).
  std::size_t max_connections = 4096;
};

class Gateway {
 public:
  /// `reg`, `store` and `slots` must outlive the Gateway.
  Gateway(const registry::Registry& reg, state::Store& store, SlotControl& slots, GatewayOptions opt);
  ~Gateway();
  Gateway(const Gateway&) = delete;
  Gateway& operator=(const Gateway&) = delete;

  /// Registers an extra exact-path route (admin API) before start(). `path` must be under
  /// /admin/ (std::invalid_argument otherwise): admin routes need the admin token and are only
  /// answered on loopback peers unless the server listens on loopback anyway.
  void add_route(std::string method, std::string path, http::Handler handler);
  /// Binds and serves. Throws http::ServerError.
  void start();
  int port() const;
  /// Closes the listener and every client connection, lets the calls they end cancel their
  /// upstream requests (release leases, log 499) for up to 2 s, then joins the threads.
  /// Idempotent; the destructor calls it.
  void stop();
  /// Metrics; policies count repairs through metrics().count_repair(policy, model).
  Metrics& metrics();
  /// The shared reasoning store for restore_reasoning (may be null). Before start().
  void set_reasoning_store(policies::ReasoningStore* store);
  /// While true (the daemon adopts or reaps the engine a previous daemon left, listening
  /// already), completion requests get 503 `slot_recovering` with Retry-After and /health says
  /// `"recovering": true`. Any thread.
  void set_recovering(bool recovering);
  /// Runs `fn` on the server's blocking pool (for admin handlers that wait, e.g. switch).
  bool post_blocking(std::function<void()> fn);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace servedeck::gateway
