// The worker's HTTP server: vLLM's surface over one loaded model.
//   POST /v1/chat/completions, POST /v1/completions, GET /v1/models, GET /health,
//   POST /tokenize, POST /detokenize, GET /metrics
// The listener comes up first; the model loads on a background thread meanwhile, and /health
// answers 503 {"status":"loading","progress":0.x} until it is loaded (then 200 {"status":"ok"}),
// or 503 {"status":"failed","error":…} if loading failed. Generation routes answer 503 while
// loading.
//
// State: loading → ready | failed (one way; a failed worker is restarted by its supervisor).
// Thread-safety: start()/stop() from one thread; the accessors from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "common/http/server.hpp"
#include "worker/server/metrics.hpp"
#include "worker/server/route_context.hpp"

namespace servedeck::worker {

enum class LoadState { loading, ready, failed };
std::string_view to_string(LoadState s);

/// Called with load progress in [0, 1].
using ProgressFn = std::function<void(double)>;
/// Loads the model (on the loader thread). Throws on failure; what() is reported by /health
/// and by wait_loaded()'s caller.
using ModelLoader = std::function<std::unique_ptr<LoadedModel>(const ProgressFn& progress)>;

class WorkerServer {
 public:
  WorkerServer(WorkerServerOptions options, ModelLoader loader);
  ~WorkerServer();  // stop()
  WorkerServer(const WorkerServer&) = delete;
  WorkerServer& operator=(const WorkerServer&) = delete;

  /// Binds and listens (throws http::ServerError naming host:port), then starts loading.
  void start();
  /// The bound port (after start()).
  int port() const;
  /// Stops the listener, then the engine. Idempotent.
  void stop();

  LoadState state() const;
  std::string load_error() const;
  double load_progress() const;
  /// Waits until the state leaves `loading` or `timeout` passes; returns the state.
  LoadState wait_loaded(std::chrono::milliseconds timeout);
  /// The loaded model (null until ready). For tests and main.
  LoadedModel* model();

 private:
  void handle(http::Request req, std::shared_ptr<http::Responder> res);
  void route(const http::Request& req, const std::shared_ptr<http::Responder>& res);
  void load();

  WorkerServerOptions options_;
  ModelLoader loader_;
  Metrics metrics_;
  std::unique_ptr<http::Server> http_;
  std::unique_ptr<LoadedModel> model_;
  std::thread load_thread_;

  mutable std::mutex mutex_;
  std::condition_variable cv_;
  LoadState state_ = LoadState::loading;
  std::string error_;
  std::atomic<double> progress_{0.0};
  std::atomic<bool> stopped_{false};
};

}  // namespace servedeck::worker
