#include "common/http/blocking_pool.hpp"

#include <algorithm>
#include <cstdio>
#include <exception>

namespace servedeck::http::detail {

BlockingPool::BlockingPool(int threads, std::size_t max_queue) : max_queue_(max_queue) {
  for (int i = 0; i < std::max(1, threads); ++i) workers_.emplace_back([this] { run(); });
}

BlockingPool::~BlockingPool() { stop(); }

bool BlockingPool::post(std::function<void()> fn) {
  std::lock_guard lk(mu_);
  if (stopping_ || queue_.size() >= max_queue_) return false;
  queue_.push_back(std::move(fn));
  cv_.notify_one();
  return true;
}

void BlockingPool::stop() {
  {
    std::lock_guard lk(mu_);
    if (stopping_ && workers_.empty()) return;
    stopping_ = true;
  }
  cv_.notify_all();
  for (auto& t : workers_)
    if (t.joinable()) t.join();
  workers_.clear();
}

void BlockingPool::run() {
  while (true) {
    std::function<void()> fn;
    {
      std::unique_lock lk(mu_);
      cv_.wait(lk, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping and drained
      fn = std::move(queue_.front());
      queue_.pop_front();
    }
    // A task that throws fails that task only (its captures, a Responder among them, are
    // released: an unanswered request then gets the server's 500); the thread takes the next.
    try {
      fn();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "servedeck: a blocking task failed (the pool continues): %s\n", e.what());
    } catch (...) {
      std::fprintf(stderr, "servedeck: a blocking task failed (the pool continues)\n");
    }
  }
}

}  // namespace servedeck::http::detail
