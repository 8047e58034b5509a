// Which processes belong to one engine launch, and how to signal them without ever reaching a
// process that is not verifiably ours.
//
// A process belongs to launch L when any of these holds:
//   1. it is in L's cgroup (engine_cgroup.hpp) — the kernel's own answer, kept across setsid(),
//      setpgid() and the death of every ancestor;
//   2. its environment (/proc/PID/environ, the environment it was exec'd with) carries L's marker
//      SERVEDECK_LAUNCH=<tag>, which the engine gets at spawn and every descendant inherits unless
//      it replaces its whole environment — this finds a setsid() grandchild when there is no cgroup;
//   3. while L's leader is alive (so its pid cannot have been reused): its process group or
//      session is the leader's pid.
// A session id or group id alone is never trusted once the leader is gone: a pid is reused as soon
// as no process names it any more, and a new process group with that number may belong to anyone.
//
// Signals go to one process at a time through a pidfd (pidfd_open, pidfd_send_signal; Linux >=
// 5.3) opened on the pid a /proc scan found, after checking that /proc/PID/stat still shows the
// start time the scan saw: the pidfd then names that very process, not a successor with its pid.
// Never kill(-pgid). On a kernel without pidfd_open the check is followed by kill(pid); the
// window between the check and the kill is the residual race there.
//
// Thread-safety: free functions, no shared state.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "gateway/supervisor/engine_cgroup.hpp"
#include "gateway/supervisor/proc_scan.hpp"

namespace servedeck::supervisor {

/// The environment variable that marks every process of a launch.
inline constexpr const char* k_launch_marker_var = "SERVEDECK_LAUNCH";

/// What identifies one launch's processes.
struct EngineIdentity {
  int64_t leader = 0;                    // the engine's pid (== its pgid and sid when we spawned it)
  uint64_t leader_start_time = 0;        // /proc/PID/stat field 22 of the leader, clock ticks since boot
  std::string tag;                       // launch_tag(): names the cgroup and the marker; "" = none
  std::shared_ptr<EngineCgroup> cgroup;  // null when the launch has no cgroup
};

/// "<8 hex digits of FNV-1a(state_dir)>-<launch id>": unique per daemon state directory and launch,
/// and computable again by a restarted daemon from what the state store recorded.
std::string launch_tag(const std::string& state_dir, int64_t launch_id);

/// The cgroup directory name of a launch: "servedeck-<tag>".
std::string launch_cgroup_name(const std::string& tag);

/// True when /proc/`pid`/environ holds the entry SERVEDECK_LAUNCH=`tag` (exactly).
bool has_launch_marker(int64_t pid, const std::string& tag, const std::string& proc_root = "/proc");

/// Every live (not zombie) process of the launch, by the three rules above; rule 3 applies only
/// when `leader_alive`. Scans /proc once.
std::vector<ProcStat> launch_members(const EngineIdentity& id, bool leader_alive,
                                     const std::string& proc_root = "/proc");

/// Sends `sig` to the process `p` describes, only if it is still that process (same pid and start
/// time). True when the signal was delivered.
bool signal_verified(const ProcStat& p, int sig);

/// pidfd_open(pid, 0) through syscall(2) (glibc 2.36's <sys/pidfd.h> lacks C linkage for C++):
/// a descriptor, or -1 with errno (ESRCH gone, ENOSYS kernel < 5.3).
int open_pidfd(int64_t pid);

/// An open pidfd of one process (closed on destruction). Invalid (fd -1) when the process is gone,
/// its start time differs from the one expected, or the kernel has no pidfd_open.
class Pidfd {
 public:
  Pidfd() = default;
  /// Opens a pidfd of `pid` and keeps it only when /proc/`pid`/stat then shows `start_time`.
  static Pidfd open_verified(int64_t pid, uint64_t start_time);
  /// Takes ownership of an already verified descriptor.
  explicit Pidfd(int fd) : fd_(fd) {}
  ~Pidfd();
  Pidfd(Pidfd&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  Pidfd& operator=(Pidfd&& o) noexcept;
  Pidfd(const Pidfd&) = delete;
  Pidfd& operator=(const Pidfd&) = delete;

  bool valid() const { return fd_ >= 0; }
  int fd() const { return fd_; }
  /// pidfd_send_signal; false when invalid or the process has exited.
  bool send(int sig) const;

 private:
  int fd_ = -1;
};

}  // namespace servedeck::supervisor
