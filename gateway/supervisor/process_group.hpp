// An engine process running in its own session, and the whole tree it spawns.
//
// The engine is started with posix_spawn(POSIX_SPAWN_SETSID), so pid == pgid == sid. Every
// descendant inherits the session id, including a grandchild that moved itself into another
// process group with setpgid() (vLLM's EngineCore and workers stay in the session). The group
// kill therefore signals the engine's process group AND every process group found in its session
// (by scanning /proc). A descendant that called setsid() itself escapes both and is not found;
// see docs/supervisor.md.
//
// note: why not Boost.Process (1.74): we need setsid (a new session, not only a new group) in the
// child, exact control of which fds the engine inherits (only stdin=/dev/null and the log file on
// 1 and 2; the daemon's listening sockets and SQLite handle must not leak into a 100 GiB engine
// that may outlive it), and signalling of the whole group/session. Boost.Process 1.74 offers a
// group (process group only, not a session) and closes fds only through its `limit_handles`
// extension, which is Windows-first and does not compose with a session leader. posix_spawn with
// POSIX_SPAWN_SETSID + posix_spawn_file_actions_addclosefrom_np (glibc ≥ 2.34; Debian 12 has
// 2.36) does all three, reports exec failure as an errno, and avoids fork() in a threaded daemon.
//
// Thread-safety: every public method may be called from any thread.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "gateway/supervisor/proc_scan.hpp"

namespace servedeck::supervisor {

struct SpawnError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct SpawnSpec {
  std::string program;                      // path, or a name looked up in PATH
  std::vector<std::string> argv;            // argv[0] included
  std::map<std::string, std::string> env;   // added to (overriding) the daemon's environment
  int log_fd = -1;                          // becomes the engine's stdout and stderr (not closed here)
};

/// Decodes a waitpid() status: the exit code, or 128 + signal number (shell convention).
int decode_wait_status(int status);

class EngineProcess {
 public:
  /// Starts `spec` in a new session. Throws SpawnError naming the program and errno text when
  /// the program cannot be executed.
  static std::shared_ptr<EngineProcess> spawn(const SpawnSpec& spec);

  /// Takes over a process started by an earlier daemon (not our child: liveness is polled from
  /// /proc every 100 ms). Returns nullptr unless `pid` exists with `start_time` (/proc/PID/stat
  /// field 22) and is not a zombie.
  static std::shared_ptr<EngineProcess> adopt(int64_t pid, uint64_t start_time);

  ~EngineProcess();
  EngineProcess(const EngineProcess&) = delete;
  EngineProcess& operator=(const EngineProcess&) = delete;

  int64_t pid() const { return pid_; }
  /// /proc/PID/stat field 22 of the leader, clock ticks since boot.
  uint64_t start_time() const { return start_time_; }
  bool adopted() const { return adopted_; }

  /// True until the leader process has exited (its status collected or, for an adopted
  /// engine, its /proc entry gone or reused).
  bool running() const;
  /// The decoded exit status once the leader exited; nullopt while running or when unknown
  /// (an adopted engine's status cannot be collected).
  std::optional<int> exit_status() const;
  /// Waits up to `timeout` for the leader to exit; returns running() == false.
  bool wait_exit(std::chrono::milliseconds timeout) const;

  /// Live members of the engine's process group or session (the leader included while alive).
  std::vector<ProcStat> members() const;

  /// Sends `sig` to the engine's process group and to every other process group found in its
  /// session. Returns the number of distinct groups signalled.
  int signal_all(int sig) const;

 private:
  EngineProcess(int64_t pid, uint64_t start_time, bool adopted);
  void watch();

  int64_t pid_;
  uint64_t start_time_;
  bool adopted_;
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  bool exited_ = false;
  bool stop_watch_ = false;
  std::optional<int> exit_status_;
  std::thread watcher_;
};

/// A process that would not die.
struct Survivor {
  ProcStat stat;
  std::optional<int64_t> vm_rss_kib;
  std::string describe() const;  // "pid 123 (python3) state D, VmRSS 10.5 GiB"
};

/// The outcome of terminate().
struct TerminateResult {
  bool sigkill_sent = false;
  std::optional<int> exit_status;       // the leader's, when known
  std::vector<int64_t> pids_seen;       // every member seen before/while stopping (for the VRAM probe)
  std::vector<Survivor> survivors;      // members still alive after SIGKILL + kill_wait
  bool clean() const { return survivors.empty(); }
  std::string describe_survivors() const;
};

/// SIGTERM to the whole group/session, wait up to `grace` for every member to exit, SIGKILL to
/// whatever is left, wait up to `kill_wait`, then report survivors (typically state D: stuck in
/// the kernel, e.g. in a driver call, holding its memory). `progress` gets one line per step.
TerminateResult terminate(EngineProcess& engine, std::chrono::milliseconds grace,
                          std::chrono::milliseconds kill_wait,
                          const std::function<void(const std::string&)>& progress = {});

/// The same for a group/session whose leader is gone (found at daemon start): SIGTERM, grace,
/// SIGKILL to every member with pgid == `id` or sid == `id`.
TerminateResult terminate_orphans(int64_t id, std::chrono::milliseconds grace,
                                  std::chrono::milliseconds kill_wait);

}  // namespace servedeck::supervisor
