// The server's pool for blocking work (Server::post_blocking; internal to common/http): a fixed
// number of threads and a bounded queue, so CPU-heavy handlers (tokenizing, template rendering,
// SQLite) never run on the I/O threads and a flood is refused instead of queued without bound.
// A task that throws is logged to stderr and ends that task only; the thread runs on.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace servedeck::http::detail {

class BlockingPool {
 public:
  /// Starts max(1, threads) threads; at most `max_queue` tasks wait.
  BlockingPool(int threads, std::size_t max_queue);
  ~BlockingPool();
  BlockingPool(const BlockingPool&) = delete;
  BlockingPool& operator=(const BlockingPool&) = delete;

  /// Queues `fn`; false when the queue is full or the pool stopped.
  bool post(std::function<void()> fn);
  /// Runs what is queued, then joins the threads. Idempotent.
  void stop();

 private:
  void run();
  std::size_t max_queue_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  std::vector<std::thread> workers_;
  bool stopping_ = false;
};

}  // namespace servedeck::http::detail
