#include "gateway/supervisor/process_group.hpp"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <set>
#include <sstream>

extern char** environ;

namespace servedeck::supervisor {

namespace {

constexpr auto k_poll = std::chrono::milliseconds(50);

std::string errno_text(int e) { return std::string(std::strerror(e)); }

void add_pids(std::vector<int64_t>& seen, const std::vector<ProcStat>& members) {
  for (const auto& m : members)
    if (std::find(seen.begin(), seen.end(), m.pid) == seen.end()) seen.push_back(m.pid);
}

/// Signals every distinct process group among `members`, plus `leader_group` itself.
int signal_groups(int64_t leader_group, const std::vector<ProcStat>& members, int sig) {
  std::set<int64_t> groups;
  if (leader_group > 0) groups.insert(leader_group);
  for (const auto& m : members)
    if (m.pgid > 0) groups.insert(m.pgid);
  int n = 0;
  for (int64_t g : groups) {
    // note: never signal group 0/1 or our own group by accident (a corrupt record).
    if (g <= 1 || g == getpgrp()) continue;
    if (::kill(static_cast<pid_t>(-g), sig) == 0) ++n;
  }
  return n;
}

/// Polls until `done()` or `timeout`, recording members seen.
bool wait_until(const std::function<bool()>& done, std::chrono::milliseconds timeout,
                const std::function<std::vector<ProcStat>()>& members, std::vector<int64_t>& seen) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    add_pids(seen, members());
    if (done()) return true;
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(k_poll);
  }
}

TerminateResult terminate_impl(int64_t id, const std::function<bool()>& leader_running,
                               std::chrono::milliseconds grace, std::chrono::milliseconds kill_wait,
                               const std::function<void(const std::string&)>& progress) {
  TerminateResult r;
  auto members = [id] { return group_or_session_members(id, id); };
  auto all_gone = [&] { return !leader_running() && members().empty(); };
  auto say = [&](const std::string& s) {
    if (progress) progress(s);
  };
  auto first = members();
  add_pids(r.pids_seen, first);
  if (all_gone()) return r;
  int groups = signal_groups(id, first, SIGTERM);
  say("stopping: SIGTERM to " + std::to_string(groups) + " process group(s) of session " + std::to_string(id) +
      " (" + std::to_string(first.size()) + " processes), grace " + std::to_string(grace.count() / 1000) + " s");
  if (wait_until(all_gone, grace, members, r.pids_seen)) return r;

  auto left = members();
  r.sigkill_sent = true;
  say("stopping: grace expired, SIGKILL to " + std::to_string(left.size()) + " remaining process(es)");
  signal_groups(id, left, SIGKILL);
  // A member may fork between the scan and the kill; repeat the kill while waiting.
  auto deadline = std::chrono::steady_clock::now() + kill_wait;
  while (!all_gone() && std::chrono::steady_clock::now() < deadline) {
    auto now_left = members();
    add_pids(r.pids_seen, now_left);
    signal_groups(id, now_left, SIGKILL);
    std::this_thread::sleep_for(k_poll);
  }
  for (const auto& m : members()) r.survivors.push_back({m, read_vm_rss_kib(m.pid)});
  return r;
}

}  // namespace

int decode_wait_status(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return -1;
}

std::shared_ptr<EngineProcess> EngineProcess::spawn(const SpawnSpec& spec) {
  if (spec.argv.empty()) throw SpawnError("spawn '" + spec.program + "': argv is empty (argv[0] expected)");
  // Environment: the daemon's, with the spec's variables replacing same-named ones.
  std::vector<std::string> env_strings;
  for (char** e = environ; e && *e; ++e) {
    std::string kv = *e;
    auto eq = kv.find('=');
    if (eq != std::string::npos && spec.env.count(kv.substr(0, eq))) continue;
    env_strings.push_back(std::move(kv));
  }
  for (const auto& [k, v] : spec.env) env_strings.push_back(k + "=" + v);
  std::vector<char*> envp;
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> argv_strings = spec.argv;
  std::vector<char*> argv;
  for (auto& s : argv_strings) argv.push_back(s.data());
  argv.push_back(nullptr);

  posix_spawn_file_actions_t fa;
  posix_spawnattr_t attr;
  posix_spawn_file_actions_init(&fa);
  posix_spawnattr_init(&attr);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  if (spec.log_fd >= 0) {
    posix_spawn_file_actions_adddup2(&fa, spec.log_fd, 1);
    posix_spawn_file_actions_adddup2(&fa, spec.log_fd, 2);
  }
  // Nothing else of the daemon's (sockets, the SQLite file) reaches the engine.
  posix_spawn_file_actions_addclosefrom_np(&fa, 3);
  sigset_t all, none;
  sigfillset(&all);
  sigemptyset(&none);
  // note: the daemon ignores SIGPIPE; an ignored disposition survives exec, so reset every signal.
  posix_spawnattr_setsigdefault(&attr, &all);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSID | POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK);
  pid_t pid = 0;
  int rc = posix_spawnp(&pid, spec.program.c_str(), &fa, &attr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  if (rc != 0) throw SpawnError("cannot start '" + spec.program + "': " + errno_text(rc));
  uint64_t start_time = 0;
  if (auto st = read_proc_stat(pid)) start_time = st->start_time;
  return std::shared_ptr<EngineProcess>(new EngineProcess(pid, start_time, false));
}

std::shared_ptr<EngineProcess> EngineProcess::adopt(int64_t pid, uint64_t start_time) {
  auto st = read_proc_stat(pid);
  if (!st || st->start_time != start_time || st->state == 'Z' || st->state == 'X') return nullptr;
  return std::shared_ptr<EngineProcess>(new EngineProcess(pid, start_time, true));
}

EngineProcess::EngineProcess(int64_t pid, uint64_t start_time, bool adopted)
    : pid_(pid), start_time_(start_time), adopted_(adopted) {
  watcher_ = std::thread([this] { watch(); });
}

EngineProcess::~EngineProcess() {
  {
    std::lock_guard lk(mu_);
    stop_watch_ = true;
  }
  cv_.notify_all();
  if (watcher_.joinable()) watcher_.join();
}

void EngineProcess::watch() {
  std::unique_lock lk(mu_);
  while (!stop_watch_) {
    bool gone = false;
    std::optional<int> status;
    if (!adopted_) {
      int st = 0;
      pid_t r = ::waitpid(static_cast<pid_t>(pid_), &st, WNOHANG);
      if (r == pid_) {
        gone = true;
        status = decode_wait_status(st);
      } else if (r < 0 && errno == ECHILD) {
        gone = true;  // someone else reaped it; status unknown
      }
    } else {
      auto s = read_proc_stat(pid_);
      gone = !s || s->start_time != start_time_ || s->state == 'Z' || s->state == 'X';
    }
    if (gone) {
      exited_ = true;
      exit_status_ = status;
      cv_.notify_all();
      return;
    }
    cv_.wait_for(lk, adopted_ ? std::chrono::milliseconds(100) : k_poll);
  }
}

bool EngineProcess::running() const {
  std::lock_guard lk(mu_);
  return !exited_;
}

std::optional<int> EngineProcess::exit_status() const {
  std::lock_guard lk(mu_);
  return exit_status_;
}

bool EngineProcess::wait_exit(std::chrono::milliseconds timeout) const {
  std::unique_lock lk(mu_);
  return cv_.wait_for(lk, timeout, [this] { return exited_; });
}

std::vector<ProcStat> EngineProcess::members() const { return group_or_session_members(pid_, pid_); }

int EngineProcess::signal_all(int sig) const { return signal_groups(pid_, members(), sig); }

std::string Survivor::describe() const {
  std::ostringstream o;
  o << "pid " << stat.pid << " (" << stat.comm << ") state " << stat.state;
  if (stat.state == 'D') o << " (uninterruptible sleep)";
  if (vm_rss_kib) {
    o.setf(std::ios::fixed);
    o.precision(2);
    o << ", VmRSS " << static_cast<double>(*vm_rss_kib) / (1024.0 * 1024.0) << " GiB";
  }
  return o.str();
}

std::string TerminateResult::describe_survivors() const {
  std::string s;
  for (const auto& v : survivors) s += (s.empty() ? "" : "; ") + v.describe();
  return s;
}

TerminateResult terminate(EngineProcess& engine, std::chrono::milliseconds grace,
                          std::chrono::milliseconds kill_wait,
                          const std::function<void(const std::string&)>& progress) {
  auto r = terminate_impl(engine.pid(), [&] { return engine.running(); }, grace, kill_wait, progress);
  engine.wait_exit(std::chrono::milliseconds(500));
  r.exit_status = engine.exit_status();
  return r;
}

TerminateResult terminate_orphans(int64_t id, std::chrono::milliseconds grace,
                                  std::chrono::milliseconds kill_wait) {
  return terminate_impl(id, [] { return false; }, grace, kill_wait, {});
}

}  // namespace servedeck::supervisor
