#include "gateway/state/janitor.hpp"

namespace servedeck::state {

Janitor::Janitor(Store& store, Retention retention, std::chrono::milliseconds interval, Log log,
                 std::function<void()> also)
    : store_(store), retention_(retention), interval_(interval), log_(std::move(log)), also_(std::move(also)) {
  sweep();
  thread_ = std::thread([this] {
    std::unique_lock lk(mu_);
    while (!cv_.wait_for(lk, interval_, [this] { return stopping_; })) {
      lk.unlock();
      sweep();
      lk.lock();
    }
  });
}

Janitor::~Janitor() {
  {
    std::lock_guard lk(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Janitor::sweep() {
  auto say = [this](const std::string& line) {
    if (log_) log_(line);
  };
  try {
    PruneCounts n = store_.prune(retention_, now_ms());
    if (n.total() > 0)
      say("retention: deleted " + std::to_string(n.documents) + " expired stored document(s), " +
          std::to_string(n.requests) + " request-log row(s), " + std::to_string(n.events) + " event(s)");
  } catch (const std::exception& e) {
    say(std::string("retention: pruning the state store failed (retried in ") +
        std::to_string(interval_.count() / 1000) + " s): " + e.what());
  }
  if (also_) {
    try {
      also_();
    } catch (const std::exception& e) {
      say(std::string("retention: ") + e.what());
    }
  }
  runs_.fetch_add(1);
}

}  // namespace servedeck::state
