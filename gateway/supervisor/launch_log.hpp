// Per-launch engine log files: <state_dir>/logs/<model>-<launch id>.log.
//
// The engine writes straight into the file (O_APPEND on its stdout and stderr), not through a
// pipe: a pipe would break (SIGPIPE / EPIPE in the engine) when the daemon restarts, and the
// restarted daemon must be able to adopt the running engine.
// Bounded: when the file grows past `max_bytes`, enforce_bound() copies it to "<path>.1"
// (replacing an older .1) and truncates it to 0 — the engine's O_APPEND writes continue at the
// new end (the logrotate "copytruncate" scheme; a few lines written during the copy may be lost).
// Rotated: open() keeps the newest `keep` launch logs of each model and deletes older ones.
//
// Thread-safety: every method may be called from any thread (the supervisor's switch thread
// while starting, its monitor while ready, status readers); rotation and the byte count are
// guarded by the log's own mutex, never by the supervisor's. The free functions have no shared
// state.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace servedeck::supervisor {

class LaunchLog {
 public:
  /// Creates <state_dir>/logs/ if needed, opens <model>-<launch_id>.log for appending and
  /// deletes the model's older launch logs beyond `keep` (by launch id). Throws
  /// std::runtime_error naming the path when the file cannot be opened.
  LaunchLog(const std::string& state_dir, const std::string& model, int64_t launch_id,
            int64_t max_bytes, int keep);
  /// Reopens an existing log for reading/bounding (adopted engine); never deletes anything.
  explicit LaunchLog(const std::string& path, int64_t max_bytes);
  ~LaunchLog();
  LaunchLog(const LaunchLog&) = delete;
  LaunchLog& operator=(const LaunchLog&) = delete;

  const std::string& path() const { return path_; }
  /// The write end to hand to the engine as stdout/stderr; -1 for a reopened log.
  int fd() const { return fd_; }
  /// Writes one line from the supervisor into the log ("servedeck: launching ...").
  void note(const std::string& line);
  /// Copy-truncates when over max_bytes. Returns true when it rotated.
  bool enforce_bound();
  /// Total bytes the engine has written so far (current size + bytes rotated away): grows while
  /// the engine prints load progress (G30: the start deadline is extended while this grows).
  int64_t bytes_written() const;

 private:
  std::string path_;
  int fd_ = -1;
  int64_t max_bytes_;
  mutable std::mutex mu_;      // guards rotated_bytes_ and serialises enforce_bound()
  int64_t rotated_bytes_ = 0;
};

/// The last `lines` lines of `path` (reading "<path>.1" too when the current file is short).
/// Returns "" when neither exists. Reads at most ~1 MiB.
std::string tail_lines(const std::string& path, int lines);

/// The launch logs of `model` in `log_dir` (name "<model>-<id>.log"), oldest first.
std::vector<std::string> launch_logs_of(const std::string& log_dir, const std::string& model);

}  // namespace servedeck::supervisor
