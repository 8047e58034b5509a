// Request counters of the worker's HTTP surface, rendered with the engine's counters as
// Prometheus text (exposition format 0.0.4) at GET /metrics.
//
// Thread-safety: all methods are thread-safe.
#pragma once

#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "worker/engine/engine.hpp"

namespace servedeck::worker {

class Metrics {
 public:
  /// Counts one answered request on `route` ("chat", "completions", "tokenize", ...) with `status`.
  void count_request(const std::string& route, int status);
  /// Prometheus text: servedeck_worker_requests_total{route,status}, prompt/generation tokens,
  /// prefix-cache hit and miss tokens, KV pool blocks by state and evictions, TTFT and decode
  /// time sums (seconds) and counts, queue depth, running, model load state.
  std::string render(const EngineStats* engine, bool loaded, double load_progress) const;

 private:
  mutable std::mutex mutex_;
  std::map<std::pair<std::string, int>, std::size_t> requests_;
};

}  // namespace servedeck::worker
