// The gateway: the daemon's HTTP front (OpenAI-compatible routes, /health, /metrics) and the
// streaming proxy to the engine of the ready slot. Admin routes are registered by the daemon
// (gateway/admin) through add_route().
#pragma once

#include <memory>
#include <string>

#include "common/http/server.hpp"
#include "gateway/state/store.hpp"
#include "gateway/supervisor/slot_control.hpp"
#include "registry/model_entry.hpp"

namespace servedeck::gateway {

class Metrics;  // gateway/server/metrics.hpp

struct GatewayOptions {
  std::string host = "127.0.0.1";
  int port = 0;                // 0 = ephemeral
  int threads = 2;
};

class Gateway {
 public:
  /// `reg`, `store` and `slots` must outlive the Gateway.
  Gateway(const registry::Registry& reg, state::Store& store, SlotControl& slots, GatewayOptions opt);
  ~Gateway();
  Gateway(const Gateway&) = delete;
  Gateway& operator=(const Gateway&) = delete;

  /// Registers an extra exact-path route (admin API) before start(). Admin routes are
  /// only answered on loopback peers unless the server listens on loopback anyway.
  void add_route(std::string method, std::string path, http::Handler handler);
  /// Binds and serves. Throws http::ServerError.
  void start();
  int port() const;
  void stop();
  Metrics& metrics();
  /// Runs `fn` on the server's blocking pool (for admin handlers that wait, e.g. switch).
  bool post_blocking(std::function<void()> fn);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace servedeck::gateway
