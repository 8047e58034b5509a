#include "gateway/service/notify.hpp"

#include <chrono>
#include <string>

#if SERVEDECK_HAVE_LIBSYSTEMD
#include <systemd/sd-daemon.h>
#endif

namespace servedeck::service {

namespace {
void send(const std::string& state) {
#if SERVEDECK_HAVE_LIBSYSTEMD
  (void)sd_notify(0, state.c_str());
#else
  (void)state;
#endif
}
}  // namespace

void notify_ready(std::string_view status) { send("READY=1\nSTATUS=" + std::string(status)); }
void notify_status(std::string_view status) { send("STATUS=" + std::string(status)); }
void notify_stopping() { send("STOPPING=1"); }

Watchdog::Watchdog() {
#if SERVEDECK_HAVE_LIBSYSTEMD
  uint64_t usec = 0;
  if (sd_watchdog_enabled(0, &usec) > 0 && usec > 0) interval_us_ = usec;
#endif
  if (interval_us_ == 0) return;
  thread_ = std::thread([this] {
    const auto period = std::chrono::microseconds(interval_us_ / 2);
    auto next = std::chrono::steady_clock::now();
    while (!stop_.load()) {
      if (std::chrono::steady_clock::now() >= next) {
        send("WATCHDOG=1");
        next = std::chrono::steady_clock::now() + period;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  });
}

Watchdog::~Watchdog() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

}  // namespace servedeck::service
