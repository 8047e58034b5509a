// One cgroup v2 directory per engine launch: every process the engine starts stays in it, whatever
// it does with its process group or session (a grandchild that calls setsid() leaves the session
// but not the cgroup), so stopping "everything of the launch" means emptying this directory.
//
// Where: a child of the daemon's own cgroup (/proc/self/cgroup "0::PATH" under the cgroup2 mount
// from /proc/self/mountinfo), named servedeck-<launch tag>. That directory must be writable:
//   - under systemd the unit says Delegate=yes (the service's cgroup subtree belongs to it; see
//     systemd/servedeck.service.in), so the daemon creates its launch cgroups there itself;
//   - run by hand as root, the daemon's cgroup is usually writable (this is how CI runs it);
//   - otherwise (a read-only /sys/fs/cgroup in a container, cgroup v1 only, or a non-root daemon
//     in a cgroup it does not own) there is no launch cgroup: default_parent() says why, the
//     supervisor logs it once, and the engine's members are found through its session and the
//     launch marker in their environment instead (see engine_identity.hpp).
// note: not a systemd scope through sd-bus: creating a transient scope on the system bus needs
// root or a polkit rule for the daemon's user, and a scope is a unit of its own that systemd no
// longer stops with servedeck.service. A delegated subtree has neither problem.
// The engine enters its cgroup before it runs a single instruction of its own (the spawn gate in
// process_group.cpp), so nothing it forks can start outside.
//
// Thread-safety: every method may be called from any thread (each reads or writes the cgroup
// file system; there is no cached state besides the path).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace servedeck::supervisor {

class EngineCgroup {
 public:
  /// The directory launch cgroups are created in: the cgroup2 mount point joined with this
  /// process's own cgroup, when it exists and is writable. nullopt with `why` (the path that was
  /// tried and the errno text, or "no cgroup2 file system mounted") otherwise.
  static std::optional<std::string> default_parent(std::string* why);

  /// Creates `parent`/`name` (an existing one is reused: a restarted daemon may find it). nullptr
  /// with `why` when mkdir fails.
  static std::shared_ptr<EngineCgroup> create(const std::string& parent, const std::string& name, std::string* why);

  /// The existing directory `parent`/`name`; nullptr when it does not exist.
  static std::shared_ptr<EngineCgroup> open(const std::string& parent, const std::string& name);

  /// Absolute directory, e.g. /sys/fs/cgroup/system.slice/servedeck.service/servedeck-1a2b3c4d-17.
  const std::string& path() const { return path_; }

  /// Moves `pid` into the cgroup (writes cgroup.procs). False with `why` on failure.
  bool add(int64_t pid, std::string* why) const;
  /// The pids listed in cgroup.procs (empty when the directory is gone).
  std::vector<int64_t> pids() const;
  /// True while any process is in the cgroup (cgroup.events "populated 1").
  bool populated() const;
  /// SIGKILL to every process in the cgroup at once, forks included (cgroup.kill, Linux >= 5.14).
  /// False when the kernel has no cgroup.kill; the caller then signals each member.
  bool kill_all() const;
  /// Removes the directory once empty (waiting up to 1 s for processes that are still exiting).
  /// False, and the directory stays, while something lives in it.
  bool remove() const;

 private:
  explicit EngineCgroup(std::string path) : path_(std::move(path)) {}
  std::string path_;
};

}  // namespace servedeck::supervisor
