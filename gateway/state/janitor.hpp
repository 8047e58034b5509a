// The Janitor: enforces the lifetimes of stored data while the daemon runs. It prunes the state
// store (Store::prune with the configured Retention) and runs any extra sweeps (capture
// retention) once when constructed — the daemon's start — and then every `interval` on its own
// thread until destroyed.
//
// A failed sweep is logged and retried at the next interval; it never ends the daemon.
// Thread-safety: construct and destroy on one thread; runs() from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "gateway/state/store.hpp"

namespace servedeck::state {

class Janitor {
 public:
  using Log = std::function<void(const std::string&)>;

  /// Sweeps once now (on the calling thread), then every `interval` on its thread. `log` gets one
  /// line per sweep that deleted anything, and every failure; `also` runs after each prune (its
  /// exceptions are logged like a failed prune). `store` must outlive the Janitor.
  Janitor(Store& store, Retention retention, std::chrono::milliseconds interval, Log log,
          std::function<void()> also = {});
  ~Janitor();  // stops the thread promptly (no wait for the next interval)
  Janitor(const Janitor&) = delete;
  Janitor& operator=(const Janitor&) = delete;

  /// Sweeps completed (the one at construction included), failed or not.
  int64_t runs() const { return runs_.load(); }

 private:
  void sweep();

  Store& store_;
  Retention retention_;
  std::chrono::milliseconds interval_;
  Log log_;
  std::function<void()> also_;
  std::atomic<int64_t> runs_{0};
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace servedeck::state
