// Helpers shared by the supervisor tests: temp dirs, deadline polling, pid checks.
#pragma once

#include <signal.h>
#include <stdlib.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "gateway/supervisor/proc_scan.hpp"
#include "gateway/supervisor/process_group.hpp"

namespace sdtest {

inline std::string temp_dir(const std::string& tag) {
  std::string t = (std::filesystem::temp_directory_path() / ("sd-" + tag + "-XXXXXX")).string();
  if (!mkdtemp(t.data())) return "";
  return t;
}

/// Polls `pred` every 20 ms until true or `timeout_ms`; returns the last value.
inline bool wait_for(const std::function<bool()>& pred, int timeout_ms) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (!pred()) {
    if (std::chrono::steady_clock::now() >= deadline) return pred();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

/// Alive = exists and is not a zombie.
inline bool alive(int64_t pid) {
  auto st = servedeck::supervisor::read_proc_stat(pid);
  return st && st->state != 'Z' && st->state != 'X';
}

inline int64_t read_pid_file(const std::string& path, int timeout_ms = 5000) {
  int64_t pid = 0;
  wait_for([&] {
    std::ifstream f(path);
    return static_cast<bool>(f >> pid) && pid > 0;
  }, timeout_ms);
  return pid;
}

inline std::string fake_engine() { return SERVEDECK_FAKE_ENGINE; }

/// Kills an engine's whole session when a test leaves its scope early (a failed REQUIRE), so a
/// failing test never leaks a process. SIGTERM first, SIGKILL after 5 s (a daemon under test gets
/// the time to stop its own engine).
struct KillOnExit {
  std::shared_ptr<servedeck::supervisor::EngineProcess> engine;
  ~KillOnExit() {
    if (engine) servedeck::supervisor::terminate(*engine, std::chrono::seconds(5), std::chrono::seconds(2));
  }
};

}  // namespace sdtest
