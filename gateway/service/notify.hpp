// systemd integration: sd_notify(3) from libsystemd. READY=1 once the admin API listens,
// STATUS= lines while switching, WATCHDOG=1 pings at half the WatchdogSec interval.
// Every function is a no-op when the daemon is not run by systemd (no $NOTIFY_SOCKET) or when
// the build has no libsystemd.
#pragma once

#include <atomic>
#include <string_view>
#include <thread>

namespace servedeck::service {

/// READY=1 plus a STATUS line.
void notify_ready(std::string_view status);
/// STATUS=<text> (shown by `systemctl status`).
void notify_status(std::string_view status);
/// STOPPING=1
void notify_stopping();

/// Sends WATCHDOG=1 every WatchdogSec/2 on its own thread while alive, when systemd asked for
/// a watchdog (sd_watchdog_enabled). Stops and joins on destruction.
class Watchdog {
 public:
  Watchdog();
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;
  /// True when systemd requested a watchdog for this process.
  bool enabled() const { return interval_us_ > 0; }

 private:
  unsigned long long interval_us_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace servedeck::service
