// Internal to the Supervisor's operations: small helpers shared by supervisor.cpp (switch,
// launch, ready wait) and supervisor_stop.cpp (stop, drain, blocker, /dev/shm reap). Not part
// of the public API; include it from nowhere else.
#pragma once

#include <chrono>
#include <cstdio>
#include <string>

#include "gateway/supervisor/supervisor.hpp"

namespace servedeck::supervisor::detail {

using Clock = std::chrono::steady_clock;

/// Seconds (fractional) elapsed since `t` on the steady clock.
inline double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

/// `s` seconds formatted with one decimal ("12.3"), for progress and error lines.
inline std::string fmt_s(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", s);
  return buf;
}

/// Passes one progress line to `p` when the caller gave a callback.
inline void say(const Progress& p, const std::string& line) {
  if (p) p(line);
}

}  // namespace servedeck::supervisor::detail
