#include "gateway/supervisor/shm_reaper.hpp"

#include <dirent.h>
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
    if (p.empty()) r.ignored_globs.push_back(g);
    else patterns.push_back(p);
  }
  if (patterns.empty()) return r;

  struct Candidate {
    std::string path;
    struct stat st;
  };
  std::vector<Candidate> candidates;
  DIR* d = opendir(shm_dir.c_str());
  if (!d) {
    r.errors.push_back("cannot read directory " + shm_dir + ": " + std::strerror(errno));
    return r;
  }
  while (dirent* e = readdir(d)) {
    std::string name = e->d_name;
    if (name == "." || name == "..") continue;
    bool match = false;
    for (const auto& p : patterns)
      if (::fnmatch(p.c_str(), name.c_str(), FNM_PERIOD) == 0) match = true;
    if (!match) continue;
    Candidate c{shm_dir + "/" + name, {}};
    if (::lstat(c.path.c_str(), &c.st) != 0 || !S_ISREG(c.st.st_mode)) continue;  // never symlinks/dirs
    candidates.push_back(c);
  }
  closedir(d);
  if (candidates.empty()) return r;

  Holders h = scan_holders(proc_root);
  r.unverified = h.unreadable_list;
  for (const auto& c : candidates) {
    int64_t bytes = static_cast<int64_t>(c.st.st_blocks) * 512;
    FileId id{static_cast<uint64_t>(c.st.st_dev), static_cast<uint64_t>(c.st.st_ino)};
    if (auto it = h.held.find(id); it != h.held.end()) {
      r.kept.push_back({c.path, bytes, it->second});
      continue;
    }
    if (auto it = h.held_paths.find(c.path); it != h.held_paths.end()) {
      r.kept.push_back({c.path, bytes, it->second});
      continue;
    }
    if (auto it = h.unreadable.find(c.st.st_uid); keep_unverifiable && it != h.unreadable.end()) {
      r.kept.push_back({c.path, bytes, "cannot verify: /proc maps/fd of " + it->second + " unreadable"});
      continue;
    }
    if (::unlink(c.path.c_str()) == 0) r.freed.push_back({c.path, bytes});
    else r.errors.push_back("unlink " + c.path + ": " + std::strerror(errno));
  }
  return r;
}

}  // namespace servedeck::supervisor
