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

/// How the engine's leader ended, `when` ("during start", "after ready") in the sentence:
/// "exited during start with status 7", "was killed by signal 9 (SIGKILL) after ready",
/// "exited after ready" (status unknown: an adopted engine).
inline std::string exit_phrase(const EngineProcess& e, const std::string& when) {
  const std::string d = e.exit_description();
  if (d.rfind("killed by", 0) == 0) return "was " + d + " " + when;
  if (auto st = e.exit_status(); st && d.rfind("exited", 0) == 0)
    return "exited " + when + " with status " + std::to_string(*st);
  return "exited " + when + (d.empty() ? "" : " (" + d + ")");
}

}  // namespace servedeck::supervisor::detail
