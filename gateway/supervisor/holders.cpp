#include "gateway/supervisor/holders.hpp"

#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <fstream>
#include <set>
#include <sstream>

#include "gateway/supervisor/proc_scan.hpp"

namespace servedeck::supervisor {

std::string Holder::describe() const {
  return "pid " + std::to_string(pid) + (command.empty() ? "" : " (" + command + ")");
}

std::string process_command(int64_t pid, const std::string& proc_root) {
  std::ifstream f(proc_root + "/" + std::to_string(pid) + "/cmdline", std::ios::binary);
  std::string raw;
  if (f) {
    char buf[512];
    f.read(buf, sizeof buf);
    raw.assign(buf, static_cast<std::size_t>(f.gcount()));
  }
  while (!raw.empty() && raw.back() == '\0') raw.pop_back();
  std::replace(raw.begin(), raw.end(), '\0', ' ');
  // Printable ASCII only: the text ends up in JSON and log lines.
  for (char& c : raw)
    if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) > 0x7e) c = '?';
  if (raw.size() > 200) raw = raw.substr(0, 200) + "...";
  if (!raw.empty()) return raw;
  auto st = read_proc_stat(pid, proc_root);
  return st ? st->comm : "";
}

std::vector<uint64_t> listening_socket_inodes(int port, const std::string& proc_root) {
  std::vector<uint64_t> out;
  for (const char* table : {"/net/tcp", "/net/tcp6"}) {
    std::ifstream f(proc_root + table);
    std::string line;
    std::getline(f, line);  // header
    while (std::getline(f, line)) {
      // sl local_address rem_address st tx_queue:rx_queue tr:tm->when retrnsmt uid timeout inode
      std::istringstream in(line);
      std::string sl, local, remote, state, queues, timer, retr, uid, timeout;
      uint64_t inode = 0;
      if (!(in >> sl >> local >> remote >> state >> queues >> timer >> retr >> uid >> timeout >> inode)) continue;
      auto colon = local.rfind(':');
      if (colon == std::string::npos || state != "0A" || inode == 0) continue;
      unsigned long p = std::strtoul(local.c_str() + colon + 1, nullptr, 16);
      if (static_cast<int>(p) == port) out.push_back(inode);
    }
  }
  return out;
}

std::vector<Holder> tcp_port_holders(int port, const std::string& proc_root) {
  std::vector<Holder> out;
  auto inodes = listening_socket_inodes(port, proc_root);
  if (inodes.empty()) return out;
  std::set<std::string> wanted;
  for (auto i : inodes) wanted.insert("socket:[" + std::to_string(i) + "]");
  DIR* d = opendir(proc_root.c_str());
  if (!d) return out;
  while (dirent* e = readdir(d)) {
    if (!std::isdigit(static_cast<unsigned char>(e->d_name[0]))) continue;
    int64_t pid = std::atoll(e->d_name);
    std::string fd_dir = proc_root + "/" + e->d_name + "/fd";
    DIR* fds = opendir(fd_dir.c_str());
    if (!fds) continue;
    bool holds = false;
    while (dirent* f = readdir(fds)) {
      if (f->d_name[0] == '.') continue;
      char target[128];
      ssize_t n = ::readlink((fd_dir + "/" + f->d_name).c_str(), target, sizeof target - 1);
      if (n <= 0) continue;
      if (wanted.count(std::string(target, static_cast<std::size_t>(n)))) holds = true;
    }
    closedir(fds);
    if (holds) out.push_back({pid, process_command(pid, proc_root)});
  }
  closedir(d);
  return out;
}

std::string describe_port_holders(int port, const std::string& proc_root) {
  auto inodes = listening_socket_inodes(port, proc_root);
  if (inodes.empty()) return "";
  auto holders = tcp_port_holders(port, proc_root);
  std::string who;
  for (const auto& h : holders) who += (who.empty() ? "" : ", ") + h.describe();
  if (who.empty()) who = "a process this daemon cannot inspect";
  return "port " + std::to_string(port) + " is held by " + who;
}

}  // namespace servedeck::supervisor
