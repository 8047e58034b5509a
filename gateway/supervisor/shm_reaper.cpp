#include "gateway/supervisor/shm_reaper.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "gateway/supervisor/proc_scan.hpp"
#include "registry/shm_glob.hpp"

namespace servedeck::supervisor {

namespace {

using FileId = std::pair<uint64_t, uint64_t>;  // (st_dev, st_ino)

struct Holders {
  std::map<FileId, std::string> held;          // file → first holder description
  std::map<uint32_t, std::string> unreadable;  // uid → "pid N" whose maps/fd could not be read
  std::vector<std::string> unreadable_list;     // every such process, described
  std::map<std::string, std::string> held_paths;  // mapped path → holder (overlayfs reports other inodes)
};

std::string holder_name(int64_t pid, const std::string& proc_root) {
  auto st = read_proc_stat(pid, proc_root);
  return "pid " + std::to_string(pid) + (st ? " (" + st->comm + ")" : "");
}

/// Reads every process's maps and fds once; records the (dev, inode) of each file it maps or holds.
Holders scan_holders(const std::string& proc_root) {
  Holders h;
  DIR* d = opendir(proc_root.c_str());
  if (!d) return h;
  while (dirent* e = readdir(d)) {
    if (!std::isdigit(static_cast<unsigned char>(e->d_name[0]))) continue;
    int64_t pid = std::atoll(e->d_name);
    std::string base = proc_root + "/" + e->d_name;
    struct stat pst {};
    if (::stat(base.c_str(), &pst) != 0) continue;  // gone
    std::string unreadable;

    std::ifstream maps(base + "/maps");
    std::string first;
    if (!maps || (!std::getline(maps, first) && !maps.eof())) {
      unreadable = "maps";
    } else {
      maps.clear();
      maps.seekg(0);
      std::string line;
      while (std::getline(maps, line)) {
        // address perms offset dev(maj:min hex) inode path
        std::istringstream in(line);
        std::string addr, perms, offset, dev;
        uint64_t inode = 0;
        if (!(in >> addr >> perms >> offset >> dev >> inode) || inode == 0) continue;
        auto colon = dev.find(':');
        if (colon == std::string::npos) continue;
        unsigned maj = static_cast<unsigned>(std::strtoul(dev.substr(0, colon).c_str(), nullptr, 16));
        unsigned min = static_cast<unsigned>(std::strtoul(dev.substr(colon + 1).c_str(), nullptr, 16));
        FileId id{static_cast<uint64_t>(makedev(maj, min)), inode};
        if (!h.held.count(id)) h.held[id] = "mapped by " + holder_name(pid, proc_root);
        std::string path;
        std::getline(in >> std::ws, path);
        if (!path.empty() && path[0] == '/' && !h.held_paths.count(path))
          h.held_paths[path] = "mapped by " + holder_name(pid, proc_root);
      }
    }
    std::string fd_dir = base + "/fd";
    if (DIR* fds = opendir(fd_dir.c_str())) {
      while (dirent* f = readdir(fds)) {
        if (f->d_name[0] == '.') continue;
        struct stat st {};
        if (::stat((fd_dir + "/" + f->d_name).c_str(), &st) != 0) continue;
        if (!S_ISREG(st.st_mode)) continue;
        FileId id{static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino)};
        if (!h.held.count(id)) h.held[id] = "open in " + holder_name(pid, proc_root);
      }
      closedir(fds);
    } else {
      unreadable += unreadable.empty() ? "fd" : " and fd";
    }
    if (!unreadable.empty()) {
      std::string who = holder_name(pid, proc_root);
      h.unreadable_list.push_back(who + ": " + unreadable + " unreadable");
      if (!h.unreadable.count(pst.st_uid)) h.unreadable[pst.st_uid] = who;
    }
  }
  closedir(d);
  return h;
}

/// The glob's name pattern inside `shm_dir`, or "" when the glob points elsewhere.
std::string name_pattern(const std::string& glob, const std::string& shm_dir) {
  std::string dir = shm_dir;
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  for (const std::string& prefix : {std::string("/dev/shm/"), dir + "/"}) {
    if (glob.rfind(prefix, 0) == 0) {
      std::string rest = glob.substr(prefix.size());
      return rest.find('/') == std::string::npos ? rest : "";
    }
  }
  return glob.find('/') == std::string::npos ? glob : "";
}

std::string gib(int64_t bytes) {
  std::ostringstream o;
  o.setf(std::ios::fixed);
  o.precision(2);
  o << static_cast<double>(bytes) / (1024.0 * 1024.0 * 1024.0) << " GiB";
  return o.str();
}

}  // namespace

int64_t ReapReport::freed_bytes() const {
  int64_t n = 0;
  for (const auto& f : freed) n += f.bytes;
  return n;
}

std::string ReapReport::summary() const {
  std::ostringstream o;
  o << "reaped " << freed.size() << " file(s), " << gib(freed_bytes()) << " (" << freed_bytes() << " bytes)";
  if (!kept.empty()) {
    o << "; kept " << kept.size() << ":";
    for (const auto& k : kept) o << " " << k.path << " (" << k.why << ")";
  }
  for (const auto& e : errors) o << "; error: " << e;
  if (!unverified.empty() && (!freed.empty() || !kept.empty()))
    o << "; not checked (/proc unreadable): " << unverified.size() << " process(es), e.g. " << unverified[0];
  return o.str();
}

ReapReport reap_shm(const std::vector<std::string>& globs, const std::string& shm_dir,
                    const std::string& proc_root, bool keep_unverifiable) {
  ReapReport r;
  std::vector<std::string> patterns;
  for (const auto& g : globs) {
    auto p = name_pattern(g, shm_dir);
    if (p.empty()) {
      r.ignored_globs.push_back(g + " (not a file directly in " + shm_dir + ")");
    } else if (auto problem = registry::shm_glob_problem("/dev/shm/" + p)) {
      r.ignored_globs.push_back(g + " (" + *problem + ")");
    } else {
      patterns.push_back(p);
    }
  }
  if (patterns.empty()) return r;

  // Every look-up below is relative to this descriptor: the directory checked is the directory
  // unlinked in, even if the path is replaced meanwhile.
  int dfd = ::open(shm_dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) {
    r.errors.push_back("cannot open directory " + shm_dir + ": " + std::strerror(errno));
    return r;
  }
  struct Candidate {
    std::string name;
    struct stat st;
  };
  std::vector<Candidate> candidates;
  int list_fd = ::dup(dfd);
  DIR* d = list_fd >= 0 ? ::fdopendir(list_fd) : nullptr;
  if (!d) {
    r.errors.push_back("cannot read directory " + shm_dir + ": " + std::strerror(errno));
    if (list_fd >= 0) ::close(list_fd);
    ::close(dfd);
    return r;
  }
  while (dirent* e = readdir(d)) {
    std::string name = e->d_name;
    if (name == "." || name == "..") continue;
    bool match = false;
    for (const auto& p : patterns)
      if (::fnmatch(p.c_str(), name.c_str(), FNM_PERIOD) == 0) match = true;
    if (!match) continue;
    Candidate c{name, {}};
    // never symlinks or directories
    if (::fstatat(dfd, name.c_str(), &c.st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(c.st.st_mode)) continue;
    candidates.push_back(c);
  }
  closedir(d);  // closes list_fd
  if (candidates.empty()) {
    ::close(dfd);
    return r;
  }

  Holders h = scan_holders(proc_root);
  r.unverified = h.unreadable_list;
  for (const auto& c : candidates) {
    const std::string path = shm_dir + "/" + c.name;
    int64_t bytes = static_cast<int64_t>(c.st.st_blocks) * 512;
    FileId id{static_cast<uint64_t>(c.st.st_dev), static_cast<uint64_t>(c.st.st_ino)};
    if (auto it = h.held.find(id); it != h.held.end()) {
      r.kept.push_back({path, bytes, it->second});
      continue;
    }
    if (auto it = h.held_paths.find(path); it != h.held_paths.end()) {
      r.kept.push_back({path, bytes, it->second});
      continue;
    }
    if (auto it = h.unreadable.find(c.st.st_uid); keep_unverifiable && it != h.unreadable.end()) {
      r.kept.push_back({path, bytes, "cannot verify: /proc maps/fd of " + it->second + " unreadable"});
      continue;
    }
    // Unlink the inode that was checked, not whatever the name means now: look the name up again
    // in the same directory and unlink only if it is still that regular file. note: Linux has no
    // "unlink if inode matches"; a rename over the name between this fstatat and the unlinkat
    // (two adjacent syscalls) is the residual race, and only the engines and their user write here.
    struct stat now {};
    if (::fstatat(dfd, c.name.c_str(), &now, AT_SYMLINK_NOFOLLOW) != 0) continue;  // already gone
    if (!S_ISREG(now.st_mode) || now.st_dev != c.st.st_dev || now.st_ino != c.st.st_ino) {
      r.kept.push_back({path, bytes, "replaced while being checked (inode changed); left for the next reap"});
      continue;
    }
    if (::unlinkat(dfd, c.name.c_str(), 0) == 0) r.freed.push_back({path, bytes});
    else r.errors.push_back("unlink " + path + ": " + std::strerror(errno));
  }
  ::close(dfd);
  return r;
}

}  // namespace servedeck::supervisor
