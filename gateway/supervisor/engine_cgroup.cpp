#include "gateway/supervisor/engine_cgroup.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

namespace servedeck::supervisor {

namespace {

/// Writes `text` to an existing cgroup control file; errno text on failure.
std::optional<std::string> write_control(const std::string& file, const std::string& text) {
  int fd = ::open(file.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) return std::string(std::strerror(errno));
  ssize_t n = ::write(fd, text.data(), text.size());
  int e = errno;
  ::close(fd);
  if (n != static_cast<ssize_t>(text.size())) return std::string(std::strerror(n < 0 ? e : EIO));
  return std::nullopt;
}

/// (mount point, root inside the hierarchy) of the first cgroup2 mount in /proc/self/mountinfo.
std::optional<std::pair<std::string, std::string>> cgroup2_mount() {
  std::ifstream f("/proc/self/mountinfo");
  std::string line;
  while (std::getline(f, line)) {
    // id parent major:minor root mount-point options [optional fields] - fstype source super-options
    auto dash = line.find(" - ");
    if (dash == std::string::npos) continue;
    std::istringstream tail(line.substr(dash + 3));
    std::string fstype;
    tail >> fstype;
    if (fstype != "cgroup2") continue;
    std::istringstream head(line.substr(0, dash));
    std::string id, parent, dev, root, mount;
    if (head >> id >> parent >> dev >> root >> mount) return std::make_pair(mount, root);
  }
  return std::nullopt;
}

/// This process's cgroup v2 path ("0::PATH" in /proc/self/cgroup).
std::optional<std::string> own_cgroup() {
  std::ifstream f("/proc/self/cgroup");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("0::", 0) == 0) return line.substr(3);
  return std::nullopt;
}

}  // namespace

std::optional<std::string> EngineCgroup::default_parent(std::string* why) {
  auto set = [&](const std::string& s) {
    if (why) *why = s;
    return std::nullopt;
  };
  auto mount = cgroup2_mount();
  if (!mount) return set("no cgroup2 file system is mounted");
  auto own = own_cgroup();
  if (!own) return set("/proc/self/cgroup has no cgroup v2 line");
  std::string rel = *own;
  const std::string& root = mount->second;
  if (root != "/" && rel.rfind(root, 0) == 0) rel = rel.substr(root.size());
  std::string dir = mount->first + (rel == "/" ? "" : rel);
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    return set("this process's cgroup " + dir + " is not visible: " + std::strerror(errno));
  if (::access(dir.c_str(), W_OK) != 0)
    return set("this process's cgroup " + dir + " is not writable: " + std::strerror(errno));
  return dir;
}

std::shared_ptr<EngineCgroup> EngineCgroup::create(const std::string& parent, const std::string& name,
                                                   std::string* why) {
  std::string path = parent + "/" + name;
  if (::mkdir(path.c_str(), 0755) != 0 && errno != EEXIST) {
    if (why) *why = "cannot create cgroup " + path + ": " + std::strerror(errno);
    return nullptr;
  }
  return std::shared_ptr<EngineCgroup>(new EngineCgroup(path));
}

std::shared_ptr<EngineCgroup> EngineCgroup::open(const std::string& parent, const std::string& name) {
  std::string path = parent + "/" + name;
  struct stat st {};
  if (::stat((path + "/cgroup.procs").c_str(), &st) != 0) return nullptr;
  return std::shared_ptr<EngineCgroup>(new EngineCgroup(path));
}

bool EngineCgroup::add(int64_t pid, std::string* why) const {
  if (auto e = write_control(path_ + "/cgroup.procs", std::to_string(pid))) {
    if (why) *why = "cannot move pid " + std::to_string(pid) + " into " + path_ + ": " + *e;
    return false;
  }
  return true;
}

std::vector<int64_t> EngineCgroup::pids() const {
  std::vector<int64_t> out;
  std::ifstream f(path_ + "/cgroup.procs");
  int64_t pid = 0;
  while (f >> pid) out.push_back(pid);
  return out;
}

bool EngineCgroup::populated() const {
  std::ifstream f(path_ + "/cgroup.events");
  std::string key;
  int value = 0;
  while (f >> key >> value)
    if (key == "populated") return value != 0;
  return !pids().empty();  // no cgroup.events (should not happen on cgroup2): ask the list
}

bool EngineCgroup::kill_all() const { return !write_control(path_ + "/cgroup.kill", "1").has_value(); }

bool EngineCgroup::remove() const {
  // note: a process that was just killed can keep the directory busy (EBUSY) for a few ms after
  // /proc shows it as a zombie; wait up to 1 s for the kernel to finish its exit.
  for (int i = 0; i < 100; ++i) {
    if (::rmdir(path_.c_str()) == 0 || errno == ENOENT) return true;
    if (errno != EBUSY) return false;
    ::usleep(10 * 1000);
  }
  return false;
}

}  // namespace servedeck::supervisor
