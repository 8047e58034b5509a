// The /dev/shm reaper: frees shared-memory files that engines leave behind (Flash-Next parks
// ~40 GiB of evicted KV in a /dev/shm buffer; shmem is unreclaimable while the file exists, so
// MemAvailable stays low until it is unlinked).
//
// Rules: only regular files directly inside `shm_dir` whose name matches one of the globs passed
// in (the slot's model's own shm_globs; fnmatch) are candidates; a glob whose name does not start
// with registry::k_min_shm_glob_prefix literal characters ("/dev/shm/*") is refused and listed in
// ignored_globs. A candidate is unlinked only when no live process maps it (/proc/*/maps: device
// + inode) or holds it open (/proc/*/fd: stat of the link), and only if the name still refers to
// the inode that was checked (fstatat + unlinkat on one directory descriptor; the residual race
// is a rename over the name between those two syscalls). Nothing else is ever touched.
//
// Processes whose maps or fd table cannot be read (non-dumpable processes, or a sandbox that
// hides them even from root) are listed in the report as `unverified`. With
// `keep_unverifiable` a candidate owned by the same uid as such a process is kept ("cannot
// verify"); without it (the default) it is reaped and the report says which processes could not
// be checked. note: the default is not strict because some containers hide pid 1's maps even
// from root, which would make the reaper never free anything there; an engine the supervisor
// started is always readable (it is our own dumpable child).
//
// Globs are written as in models.toml: "/dev/shm/flashnext-kv-*" (absolute, under /dev/shm) or a
// bare name pattern "flashnext-kv-*". Tests pass a temporary directory as `shm_dir`; a glob
// "/dev/shm/x-*" then matches "x-*" inside that directory.
//
// Thread-safety: free function, no shared state.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace servedeck::supervisor {

struct ReapedFile {
  std::string path;
  int64_t bytes = 0;       // st_blocks × 512: what unlinking returns to the system
};

struct KeptFile {
  std::string path;
  int64_t bytes = 0;
  std::string why;         // "mapped by pid 123 (python3)", "open in pid 9", "cannot verify: ..."
};

struct ReapReport {
  std::vector<ReapedFile> freed;
  std::vector<KeptFile> kept;
  std::vector<std::string> ignored_globs;  // globs never applied, each with why (not under shm_dir, too broad)
  std::vector<std::string> errors;         // unlink failures, unreadable directory
  std::vector<std::string> unverified;     // "pid 1 (init): maps unreadable" — processes not checked
  int64_t freed_bytes() const;
  std::string summary() const;             // "reaped 2 files, 40.00 GiB; kept 1 (mapped by pid 7)"
};

/// Reaps `shm_dir` (default /dev/shm) against `globs`. `proc_root` is /proc (injectable for tests
/// of the parser only; the held-open check in tests uses the real /proc).
ReapReport reap_shm(const std::vector<std::string>& globs, const std::string& shm_dir = "/dev/shm",
                    const std::string& proc_root = "/proc", bool keep_unverifiable = false);

}  // namespace servedeck::supervisor
