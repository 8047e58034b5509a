// An engine process running in its own session, and everything of its launch.
//
// The engine is started in a new session (pid == pgid == sid), with stdin /dev/null, stdout and
// stderr on the launch log, no other descriptor of the daemon, default signal dispositions and an
// empty mask — and, before it runs any code of its own, inside its launch cgroup when it has one
// (engine_cgroup.hpp) and with SERVEDECK_LAUNCH=<tag> in its environment. Which processes are
// "the engine" and how they are signalled (one pidfd at a time, each verified; never kill(-pgid))
// is engine_identity.hpp.
//
// note: why fork + a start gate rather than posix_spawn (or Boost.Process 1.74, which has no
// session and no fd control at all): the child must be in its cgroup before it can fork anything,
// and posix_spawn runs no code between fork and exec. The child blocks on a pipe until the parent
// has opened a pidfd of it and written its pid into cgroup.procs, then does exactly what
// posix_spawn(POSIX_SPAWN_SETSID | SETSIGDEF | SETSIGMASK) with closefrom(3) did, using only
// async-signal-safe calls (the daemon is multi-threaded), and reports an exec failure as an errno
// over a close-on-exec pipe. clone3(CLONE_INTO_CGROUP) would avoid the gate but is blocked
// (ENOSYS) by common container seccomp profiles, and a launch without a cgroup needs the same code.
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

#include "gateway/supervisor/engine_cgroup.hpp"
#include "gateway/supervisor/engine_identity.hpp"
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
  std::string tag;                          // launch tag (engine_identity.hpp); "" = no marker
  std::shared_ptr<EngineCgroup> cgroup;     // the engine starts inside it; null = none
};

/// Decodes a waitpid() status: the exit code, or 128 + signal number (shell convention; what the
/// state store's exit_status column holds).
int decode_wait_status(int status);

/// A waitpid() status as words: "exited with status 7", "killed by signal 9 (SIGKILL)" (with
/// " (core dumped)" when it did).
std::string describe_wait_status(int status);

class EngineProcess {
 public:
  /// Starts `spec` in a new session (and its cgroup). Throws SpawnError naming the program and
  /// errno text when the program cannot be found or executed. A cgroup the engine could not be
  /// moved into is dropped (cgroup_warning() says why); the launch then runs without one.
  static std::shared_ptr<EngineProcess> spawn(const SpawnSpec& spec);

  /// Takes over a process started by an earlier daemon (not our child: liveness is polled from
  /// /proc every 100 ms). Returns nullptr unless `pid` exists with `start_time` (/proc/PID/stat
  /// field 22) and is not a zombie. `tag` and `cgroup` are the launch's (may be empty / null).
  static std::shared_ptr<EngineProcess> adopt(int64_t pid, uint64_t start_time, std::string tag = "",
                                              std::shared_ptr<EngineCgroup> cgroup = nullptr);

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
  /// describe_wait_status() of the leader's exit; "" while running or when unknown.
  std::string exit_description() const;
  /// The launch's identity (leader, tag, cgroup).
  const EngineIdentity& identity() const { return identity_; }
  /// Why the launch has no cgroup although one was asked for; "" otherwise.
  const std::string& cgroup_warning() const { return cgroup_warning_; }
  /// Waits up to `timeout` for the leader to exit; returns running() == false.
  bool wait_exit(std::chrono::milliseconds timeout) const;

  /// Live members of the launch (engine_identity.hpp: its cgroup, its marker, and while the
  /// leader lives its group and session), the leader included while alive.
  std::vector<ProcStat> members() const;

  /// Sends `sig` to the leader (through its pidfd) and to every other member, each verified.
  /// SIGKILL also goes through cgroup.kill when the launch has a cgroup. Returns how many
  /// processes were signalled.
  int signal_all(int sig) const;

 private:
  EngineProcess(int64_t pid, uint64_t start_time, bool adopted, Pidfd leader, EngineIdentity identity);
  void watch();

  int64_t pid_;
  uint64_t start_time_;
  bool adopted_;
  Pidfd leader_fd_;               // invalid on a kernel without pidfd_open
  EngineIdentity identity_;
  std::string cgroup_warning_;
  std::optional<int> wait_status_;  // raw waitpid() status, guarded by mu_
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  bool exited_ = false;
  bool stop_watch_ = false;
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

/// SIGTERM to every member of the launch, wait up to `grace` for every member to exit, SIGKILL to
/// whatever is left, wait up to `kill_wait`, then report survivors (typically state D: stuck in
/// the kernel, e.g. in a driver call, holding its memory). Removes the launch cgroup once empty.
/// `progress` gets one line per step; `each_poll` runs at every poll of the waits (~every
/// 50 ms; the supervisor bounds the engine's log there, which a dying engine may still flood).
TerminateResult terminate(EngineProcess& engine, std::chrono::milliseconds grace,
                          std::chrono::milliseconds kill_wait,
                          const std::function<void(const std::string&)>& progress = {},
                          const std::function<void()>& each_poll = {});

/// The same for a launch whose leader is gone (found at daemon start): only processes verifiably
/// of the launch — in its cgroup or carrying its marker — are signalled; a process that merely
/// carries the dead leader's pid as its group or session id is left alone (that number may have
/// been reused).
TerminateResult terminate_orphans(const EngineIdentity& id, std::chrono::milliseconds grace,
                                  std::chrono::milliseconds kill_wait);

}  // namespace servedeck::supervisor
