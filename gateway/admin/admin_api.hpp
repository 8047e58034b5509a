// The admin API: what the `servedeck` CLI talks to. The gateway answers these routes only with
// the daemon's admin token (admin/admin_token.hpp) and only for loopback peers, checked from the
// request head before any handler here runs (gateway/server/access.hpp). Routes:
//
//   POST /admin/switch    {"model": "glm53"}  → text/event-stream: one `data: <line>` event per
//                         progress step as it happens (preflight lines, starting, loading: …,
//                         "ready in N s"), then `event: result` with data
//                         {"ok": bool, "error": "...", "seconds": s}.
//   POST /admin/stop      {} → the same stream shape for the stop.
//   GET  /admin/status    → application/json: Supervisor::status_json() + {"daemon": {...}}.
//   GET  /admin/logs?model=M&lines=N&follow=1 → text/plain: the last N lines (default 100) of the
//                         model's launch log (the current launch when model is empty); with
//                         follow=1 the response stays open and new log bytes are sent as written
//                         (admin/log_follower.hpp: at most 1 MiB a read; a failure ends the stream
//                         with a "servedeck: following … stopped: …" line and is logged).
//   POST /admin/preflight {"model": "glm53"} → application/json {"report": {...}, "table": "..."}.
//   GET  /admin/models    → application/json {"models": [{name, served_name, aliases, engine, ctx,
//                         state}]}.
//
// Errors use the OpenAI envelope with type "servedeck_admin_error".
// Thread-safety: handlers may run concurrently; switches and stops run on the supervisor's own
// switch queue, everything else blocking on `post_blocking` (or, for log following, a thread per
// follower, at most k_max_log_followers).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "common/http/server.hpp"
#include "gateway/state/store.hpp"
#include "gateway/supervisor/supervisor.hpp"
#include "preflight/preflight.hpp"
#include "registry/model_entry.hpp"

namespace servedeck::admin {

constexpr int k_max_log_followers = 8;

struct AdminContext {
  supervisor::Supervisor* supervisor = nullptr;
  const registry::Registry* registry = nullptr;
  state::Store* store = nullptr;
  preflight::Readings* readings = nullptr;
  /// Runs blocking work off the I/O threads (Gateway::post_blocking). Returns false when full.
  std::function<bool(std::function<void()>)> post_blocking;
  /// Also gets every progress line of a switch/stop run through the API (the daemon's own log,
  /// systemd STATUS=). May be empty.
  std::function<void(const std::string&)> on_progress;
  /// Facts about the daemon for /admin/status ("daemon": pid, config path, listen address).
  std::function<nlohmann::json()> daemon_info;
};

struct Route {
  std::string method;
  std::string path;
  http::Handler handler;
};

/// The admin routes over `ctx` (its pointers must outlive the routes).
std::vector<Route> admin_routes(AdminContext ctx);

/// `key` from an undecoded query string ("model=a&lines=5"), percent-decoded; "" when absent.
std::string query_param(const std::string& query, const std::string& key);

}  // namespace servedeck::admin
