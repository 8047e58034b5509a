#include "gateway/supervisor/engine_identity.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <set>

namespace servedeck::supervisor {

namespace {

/// note: /proc/PID/environ of a vLLM worker is a few KiB; 1 MiB bounds a hostile one.
constexpr std::size_t k_max_environ_bytes = 1 << 20;

std::string read_bounded(const std::string& path, std::size_t max) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return {};
  std::string out;
  char buf[8192];
  while (out.size() < max) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    out.append(buf, static_cast<std::size_t>(n));
  }
  ::close(fd);
  return out;
}

}  // namespace

std::string launch_tag(const std::string& state_dir, int64_t launch_id) {
  uint32_t h = 2166136261u;  // FNV-1a, 32 bit
  for (unsigned char c : state_dir) {
    h ^= c;
    h *= 16777619u;
  }
  char buf[16];
  std::snprintf(buf, sizeof buf, "%08x", h);
  return std::string(buf) + "-" + std::to_string(launch_id);
}

std::string launch_cgroup_name(const std::string& tag) { return "servedeck-" + tag; }

bool has_launch_marker(int64_t pid, const std::string& tag, const std::string& proc_root) {
  if (tag.empty()) return false;
  const std::string env = read_bounded(proc_root + "/" + std::to_string(pid) + "/environ", k_max_environ_bytes);
  const std::string entry = std::string(k_launch_marker_var) + "=" + tag;
  for (std::size_t pos = 0; pos < env.size();) {
    std::size_t end = env.find('\0', pos);
    if (end == std::string::npos) end = env.size();
    if (env.compare(pos, end - pos, entry) == 0) return true;
    pos = end + 1;
  }
  return false;
}

std::vector<ProcStat> launch_members(const EngineIdentity& id, bool leader_alive, const std::string& proc_root) {
  std::set<int64_t> in_cgroup;
  if (id.cgroup)
    for (int64_t p : id.cgroup->pids()) in_cgroup.insert(p);
  std::vector<ProcStat> out;
  DIR* d = opendir(proc_root.c_str());
  if (!d) return out;
  const int64_t self = getpid();
  while (dirent* e = readdir(d)) {
    if (!std::isdigit(static_cast<unsigned char>(e->d_name[0]))) continue;
    int64_t pid = std::atoll(e->d_name);
    if (pid <= 1 || pid == self) continue;  // never init, never the daemon itself
    auto st = read_proc_stat(pid, proc_root);
    if (!st || st->state == 'Z' || st->state == 'X') continue;
    bool member = in_cgroup.count(pid) > 0;
    if (!member && leader_alive && id.leader > 1) member = st->sid == id.leader || st->pgid == id.leader;
    if (!member) member = has_launch_marker(pid, id.tag, proc_root);
    if (member) out.push_back(*st);
  }
  closedir(d);
  return out;
}

int open_pidfd(int64_t pid) { return static_cast<int>(::syscall(SYS_pidfd_open, static_cast<pid_t>(pid), 0u)); }

Pidfd Pidfd::open_verified(int64_t pid, uint64_t start_time) {
  if (pid <= 1) return {};
  int fd = open_pidfd(pid);
  if (fd < 0) return {};
  auto st = read_proc_stat(pid);
  if (!st || st->start_time != start_time) {
    ::close(fd);
    return {};
  }
  return Pidfd(fd);
}

Pidfd::~Pidfd() {
  if (fd_ >= 0) ::close(fd_);
}

Pidfd& Pidfd::operator=(Pidfd&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = o.fd_;
    o.fd_ = -1;
  }
  return *this;
}

bool Pidfd::send(int sig) const {
  return fd_ >= 0 && ::syscall(SYS_pidfd_send_signal, fd_, sig, nullptr, 0u) == 0;
}

bool signal_verified(const ProcStat& p, int sig) {
  if (p.pid <= 1 || p.pid == getpid()) return false;
  int fd = open_pidfd(p.pid);
  if (fd < 0 && errno != ENOSYS) return false;  // gone (ESRCH), or not ours to open
  auto st = read_proc_stat(p.pid);
  const bool same = st && st->start_time == p.start_time;
  if (fd >= 0) {
    Pidfd guard(fd);
    return same && guard.send(sig);
  }
  // No pidfd_open (Linux < 5.3): check, then kill the pid. The residual race is the time between.
  return same && ::kill(static_cast<pid_t>(p.pid), sig) == 0;
}

}  // namespace servedeck::supervisor
