#include "gateway/supervisor/process_group.hpp"

#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <map>
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

/// `program` as execve needs it: a path as given when it has a '/', else the first executable
/// match in $PATH. Resolved in the parent: the child may only make async-signal-safe calls.
std::string resolve_program(const std::string& program) {
  if (program.find('/') != std::string::npos) return program;
  const char* path = std::getenv("PATH");
  std::string dirs = path ? path : "/usr/local/bin:/usr/bin:/bin";
  std::size_t pos = 0;
  while (pos <= dirs.size()) {
    std::size_t colon = dirs.find(':', pos);
    std::string dir = dirs.substr(pos, colon == std::string::npos ? std::string::npos : colon - pos);
    std::string candidate = (dir.empty() ? "." : dir) + "/" + program;
    struct stat st {};
    if (::stat(candidate.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(candidate.c_str(), X_OK) == 0)
      return candidate;
    if (colon == std::string::npos) break;
    pos = colon + 1;
  }
  return "";
}

/// `fd` duplicated to a descriptor >= 10 (close-on-exec) and the original closed, so the child's
/// dup2() onto 0..3 can never overwrite one it still needs.
int high_fd(int fd) {
  if (fd < 0) return fd;
  int h = ::fcntl(fd, F_DUPFD_CLOEXEC, 10);
  ::close(fd);
  return h;
}

/// What the child needs, prepared before fork (no allocation after it).
struct ChildPlan {
  const char* path;
  char* const* argv;
  char* const* envp;
  int gate_read;   // blocks until the parent writes 'g'
  int report;      // exec failure: the errno goes here
  int devnull;
  int log;         // -1: keep the daemon's stdout/stderr
};

[[noreturn]] void child_fail(int fd, int e) {
  ssize_t n = ::write(fd, &e, sizeof e);
  (void)n;
  ::_exit(127);
}

/// The child side of spawn(): async-signal-safe calls only.
[[noreturn]] void run_child(const ChildPlan& c) {
  char go = 0;
  ssize_t n;
  do {
    n = ::read(c.gate_read, &go, 1);
  } while (n < 0 && errno == EINTR);
  if (n != 1 || go != 'g') ::_exit(127);  // the parent gave up (its end closed)
  if (::setsid() < 0) child_fail(c.report, errno);
  if (::dup2(c.devnull, 0) < 0) child_fail(c.report, errno);
  if (c.log >= 0 && (::dup2(c.log, 1) < 0 || ::dup2(c.log, 2) < 0)) child_fail(c.report, errno);
  if (::dup2(c.report, 3) < 0) child_fail(c.report, errno);
  ::fcntl(3, F_SETFD, FD_CLOEXEC);
  ::close_range(4, ~0U, 0);  // nothing else of the daemon's (sockets, the SQLite file) reaches the engine
  // note: the daemon ignores SIGPIPE; an ignored disposition survives exec, so reset every signal.
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  for (int s = 1; s < NSIG; ++s) ::sigaction(s, &dfl, nullptr);
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  ::execve(c.path, c.argv, c.envp);
  child_fail(3, errno);
}

/// What terminate_impl() stops: a live engine or the leftovers of a dead one.
struct Target {
  std::string label;  // "pid 123" / "launch 1a2b3c4d-7"
  std::function<bool()> leader_running;
  std::function<std::vector<ProcStat>()> members;
  std::function<int(int)> signal_all;
  std::shared_ptr<EngineCgroup> cgroup;
};

int signal_members(const std::vector<ProcStat>& members, int sig) {
  int n = 0;
  for (const auto& m : members) n += signal_verified(m, sig) ? 1 : 0;
  return n;
}

TerminateResult terminate_impl(const Target& t, std::chrono::milliseconds grace, std::chrono::milliseconds kill_wait,
                               const std::function<void(const std::string&)>& progress,
                               const std::function<void()>& each_poll) {
  TerminateResult r;
  // Every process a scan ever found, by pid and start time: a member stays one until it is gone
  // (no /proc entry, a zombie, or its pid reused). note: a process killed mid-scan has already
  // dropped its memory (so its environment, and the marker in it, reads empty) while it still
  // holds its descriptors, the engine's port among them; only its disappearance counts.
  std::map<int64_t, uint64_t> known;
  auto alive = [](int64_t pid, uint64_t start_time) {
    auto s = read_proc_stat(pid);
    return s && s->start_time == start_time && s->state != 'Z' && s->state != 'X';
  };
  auto gone_now = [&] {
    auto m = t.members();
    add_pids(r.pids_seen, m);
    for (const auto& p : m) known.emplace(p.pid, p.start_time);
    bool any = !m.empty() || t.leader_running();
    for (const auto& [pid, start] : known) any = any || alive(pid, start);
    return !any;
  };
  auto kill_known = [&] {
    for (const auto& [pid, start] : known) {
      ProcStat p;
      p.pid = pid;
      p.start_time = start;
      signal_verified(p, SIGKILL);
    }
  };
  auto wait_gone = [&](std::chrono::milliseconds timeout, bool repeat_kill) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      if (gone_now()) return true;
      if (std::chrono::steady_clock::now() >= deadline) return false;
      // A member may fork between the scan and the kill; repeat the kill while waiting.
      if (repeat_kill) {
        t.signal_all(SIGKILL);
        kill_known();
      }
      if (each_poll) each_poll();
      std::this_thread::sleep_for(k_poll);
    }
  };
  auto say = [&](const std::string& s) {
    if (progress) progress(s);
  };
  auto finish = [&] {
    if (r.survivors.empty() && t.cgroup) t.cgroup->remove();
    return r;
  };
  if (gone_now()) return finish();
  const std::string where = t.cgroup ? " (cgroup " + t.cgroup->path() + ")" : "";
  int n = t.signal_all(SIGTERM);
  say("stopping: SIGTERM to " + std::to_string(n) + " process(es) of " + t.label + where + ", grace " +
      std::to_string(grace.count() / 1000) + " s");
  if (wait_gone(grace, false)) return finish();

  r.sigkill_sent = true;
  say("stopping: grace expired, SIGKILL to " + std::to_string(t.members().size()) + " remaining process(es)");
  t.signal_all(SIGKILL);
  kill_known();
  if (wait_gone(kill_wait, true)) return finish();
  for (const auto& [pid, start] : known)
    if (alive(pid, start))
      if (auto st = read_proc_stat(pid)) r.survivors.push_back({*st, read_vm_rss_kib(pid)});
  return finish();
}

}  // namespace

int decode_wait_status(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return -1;
}

std::string describe_wait_status(int status) {
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    int sig = WTERMSIG(status);
    const char* abbrev = ::sigabbrev_np(sig);
    return "killed by signal " + std::to_string(sig) + (abbrev ? " (SIG" + std::string(abbrev) + ")" : "") +
           (WCOREDUMP(status) ? " (core dumped)" : "");
  }
  return "ended with wait status " + std::to_string(status);
}

std::shared_ptr<EngineProcess> EngineProcess::spawn(const SpawnSpec& spec) {
  if (spec.argv.empty()) throw SpawnError("spawn '" + spec.program + "': argv is empty (argv[0] expected)");
  const std::string path = resolve_program(spec.program);
  if (path.empty()) throw SpawnError("cannot start '" + spec.program + "': not found in PATH");
  // Environment: the daemon's, with the spec's variables (and the launch marker) replacing
  // same-named ones.
  std::vector<std::string> env_strings;
  for (char** e = environ; e && *e; ++e) {
    std::string kv = *e;
    auto eq = kv.find('=');
    std::string key = eq == std::string::npos ? kv : kv.substr(0, eq);
    if (spec.env.count(key) || key == k_launch_marker_var) continue;
    env_strings.push_back(std::move(kv));
  }
  for (const auto& [k, v] : spec.env)
    if (k != k_launch_marker_var) env_strings.push_back(k + "=" + v);
  if (!spec.tag.empty()) env_strings.push_back(std::string(k_launch_marker_var) + "=" + spec.tag);
  std::vector<char*> envp;
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> argv_strings = spec.argv;
  std::vector<char*> argv;
  for (auto& s : argv_strings) argv.push_back(s.data());
  argv.push_back(nullptr);

  int gate[2], report[2];
  if (::pipe2(gate, O_CLOEXEC) != 0)
    throw SpawnError("cannot start '" + spec.program + "': pipe: " + errno_text(errno));
  if (::pipe2(report, O_CLOEXEC) != 0) {
    int e = errno;
    ::close(gate[0]);
    ::close(gate[1]);
    throw SpawnError("cannot start '" + spec.program + "': pipe: " + errno_text(e));
  }
  ChildPlan plan{path.c_str(), argv.data(), envp.data(), high_fd(gate[0]), high_fd(report[1]),
                 high_fd(::open("/dev/null", O_RDONLY | O_CLOEXEC)),
                 spec.log_fd >= 0 ? ::fcntl(spec.log_fd, F_DUPFD_CLOEXEC, 10) : -1};
  auto close_child_ends = [&] {
    for (int fd : {plan.gate_read, plan.report, plan.devnull, plan.log})
      if (fd >= 0) ::close(fd);
  };
  if (plan.gate_read < 0 || plan.report < 0 || plan.devnull < 0 || (spec.log_fd >= 0 && plan.log < 0)) {
    int e = errno;
    close_child_ends();
    ::close(gate[1]);
    ::close(report[0]);
    throw SpawnError("cannot start '" + spec.program + "': descriptors: " + errno_text(e));
  }
  // Every signal blocked across fork: no daemon handler may run in the child before it resets them.
  sigset_t all, old;
  sigfillset(&all);
  ::pthread_sigmask(SIG_SETMASK, &all, &old);
  pid_t pid = ::fork();
  if (pid == 0) run_child(plan);
  int fork_errno = errno;
  ::pthread_sigmask(SIG_SETMASK, &old, nullptr);
  close_child_ends();
  if (pid < 0) {
    ::close(gate[1]);
    ::close(report[0]);
    throw SpawnError("cannot start '" + spec.program + "': fork: " + errno_text(fork_errno));
  }
  // The child waits at the gate: its pid cannot be reused (it is our unreaped child), and it has
  // forked nothing yet, so the pidfd and the cgroup move are both race-free.
  int pidfd = open_pidfd(pid);
  EngineIdentity identity;
  identity.leader = pid;
  identity.tag = spec.tag;
  std::string cgroup_warning;
  if (spec.cgroup) {
    if (spec.cgroup->add(pid, &cgroup_warning)) {
      identity.cgroup = spec.cgroup;
    } else {
      spec.cgroup->remove();
    }
  }
  ssize_t w = ::write(gate[1], "g", 1);
  ::close(gate[1]);
  int exec_errno = 0;
  ssize_t n;
  do {
    n = ::read(report[0], &exec_errno, sizeof exec_errno);
  } while (n < 0 && errno == EINTR);
  ::close(report[0]);
  if (w != 1 || n > 0) {
    int st = 0;
    ::waitpid(pid, &st, 0);
    if (pidfd >= 0) ::close(pidfd);
    if (identity.cgroup) identity.cgroup->remove();
    throw SpawnError("cannot start '" + spec.program + "': " +
                     (n > 0 ? errno_text(exec_errno) : std::string("the start gate could not be opened")));
  }
  if (auto st = read_proc_stat(pid)) identity.leader_start_time = st->start_time;
  auto e = std::shared_ptr<EngineProcess>(
      new EngineProcess(pid, identity.leader_start_time, false, Pidfd(pidfd), std::move(identity)));
  e->cgroup_warning_ = cgroup_warning;
  return e;
}

std::shared_ptr<EngineProcess> EngineProcess::adopt(int64_t pid, uint64_t start_time, std::string tag,
                                                    std::shared_ptr<EngineCgroup> cgroup) {
  auto st = read_proc_stat(pid);
  if (!st || st->start_time != start_time || st->state == 'Z' || st->state == 'X') return nullptr;
  // Without a pidfd (the process vanished since the check, or no pidfd_open) the leader is
  // signalled through signal_verified() like every other member.
  Pidfd fd = Pidfd::open_verified(pid, start_time);
  EngineIdentity identity{pid, start_time, std::move(tag), std::move(cgroup)};
  return std::shared_ptr<EngineProcess>(new EngineProcess(pid, start_time, true, std::move(fd), std::move(identity)));
}

EngineProcess::EngineProcess(int64_t pid, uint64_t start_time, bool adopted, Pidfd leader, EngineIdentity identity)
    : pid_(pid),
      start_time_(start_time),
      adopted_(adopted),
      leader_fd_(std::move(leader)),
      identity_(std::move(identity)) {
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
        status = st;
      } else if (r < 0 && errno == ECHILD) {
        gone = true;  // someone else reaped it; status unknown
      }
    } else {
      auto s = read_proc_stat(pid_);
      gone = !s || s->start_time != start_time_ || s->state == 'Z' || s->state == 'X';
    }
    if (gone) {
      exited_ = true;
      wait_status_ = status;
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
  if (!wait_status_) return std::nullopt;
  return decode_wait_status(*wait_status_);
}

std::string EngineProcess::exit_description() const {
  std::lock_guard lk(mu_);
  return wait_status_ ? describe_wait_status(*wait_status_) : "";
}

bool EngineProcess::wait_exit(std::chrono::milliseconds timeout) const {
  std::unique_lock lk(mu_);
  return cv_.wait_for(lk, timeout, [this] { return exited_; });
}

std::vector<ProcStat> EngineProcess::members() const { return launch_members(identity_, running()); }

int EngineProcess::signal_all(int sig) const {
  int n = 0;
  if (running()) {
    ProcStat leader;
    leader.pid = pid_;
    leader.start_time = start_time_;
    if (leader_fd_.valid() ? leader_fd_.send(sig) : signal_verified(leader, sig)) ++n;
  }
  if (sig == SIGKILL && identity_.cgroup) identity_.cgroup->kill_all();
  for (const auto& m : members())
    if (m.pid != pid_ && signal_verified(m, sig)) ++n;
  return n;
}

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
                          const std::function<void(const std::string&)>& progress,
                          const std::function<void()>& each_poll) {
  Target t;
  t.label = "pid " + std::to_string(engine.pid()) + "'s launch";
  t.leader_running = [&] { return engine.running(); };
  t.members = [&] { return engine.members(); };
  t.signal_all = [&](int sig) { return engine.signal_all(sig); };
  t.cgroup = engine.identity().cgroup;
  auto r = terminate_impl(t, grace, kill_wait, progress, each_poll);
  engine.wait_exit(std::chrono::milliseconds(500));
  r.exit_status = engine.exit_status();
  return r;
}

TerminateResult terminate_orphans(const EngineIdentity& id, std::chrono::milliseconds grace,
                                  std::chrono::milliseconds kill_wait) {
  Target t;
  t.label = "launch " + (id.tag.empty() ? "of pid " + std::to_string(id.leader) : id.tag);
  t.leader_running = [] { return false; };
  t.members = [&id] { return launch_members(id, false); };
  t.signal_all = [&id](int sig) {
    if (sig == SIGKILL && id.cgroup) id.cgroup->kill_all();
    return signal_members(launch_members(id, false), sig);
  };
  t.cgroup = id.cgroup;
  return terminate_impl(t, grace, kill_wait, {}, {});
}

}  // namespace servedeck::supervisor
