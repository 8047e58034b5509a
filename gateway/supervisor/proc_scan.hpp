// Reading /proc: one process's stat line, its resident memory, and every process that belongs
// to a process group or session. The supervisor uses these to prove that an engine and all of
// its descendants are gone (a grandchild that called setpgid() still carries the engine's
// session id) and to check, at daemon start, that a recorded pid is still the same process.
//
// Thread-safety: free functions, no shared state.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace servedeck::supervisor {

/// Fields of /proc/PID/stat (proc(5)) the supervisor needs.
struct ProcStat {
  int64_t pid = 0;
  std::string comm;         // field 2, without the parentheses
  char state = '?';         // field 3: R S D Z T t X I ...
  int64_t ppid = 0;         // field 4
  int64_t pgid = 0;         // field 5
  int64_t sid = 0;          // field 6
  uint64_t start_time = 0;  // field 22: clock ticks since boot (identifies a pid across reuse)
};

/// Parses one /proc/PID/stat line. nullopt when malformed (comm may contain ')' and spaces: the
/// last ')' ends it).
std::optional<ProcStat> parse_proc_stat(const std::string& line);

/// Reads /proc/`pid`/stat. nullopt when the process does not exist (or vanished mid-read).
std::optional<ProcStat> read_proc_stat(int64_t pid, const std::string& proc_root = "/proc");

/// VmRSS of `pid` from /proc/PID/status, in KiB; nullopt when absent (zombie, kernel thread, gone).
std::optional<int64_t> read_vm_rss_kib(int64_t pid, const std::string& proc_root = "/proc");

/// Every live process (state not Z or X) whose process group is `pgid` or whose session is
/// `sid` (either may be 0 to skip it). Scans /proc/[0-9]*/stat.
std::vector<ProcStat> group_or_session_members(int64_t pgid, int64_t sid,
                                               const std::string& proc_root = "/proc");

}  // namespace servedeck::supervisor
