#include "gateway/supervisor/proc_scan.hpp"

#include <dirent.h>

#include <cctype>
#include <fstream>
#include <sstream>

namespace servedeck::supervisor {

std::optional<ProcStat> parse_proc_stat(const std::string& line) {
  auto open = line.find('(');
  auto close = line.rfind(')');
  if (open == std::string::npos || close == std::string::npos || close < open) return std::nullopt;
  ProcStat s;
  try {
    s.pid = std::stoll(line.substr(0, open));
  } catch (...) {
    return std::nullopt;
  }
  s.comm = line.substr(open + 1, close - open - 1);
  std::istringstream in(line.substr(close + 1));
  // Fields 3.. after comm. Field 22 is start_time: 19 fields after state.
  std::string state;
  if (!(in >> state) || state.empty()) return std::nullopt;
  s.state = state[0];
  if (!(in >> s.ppid >> s.pgid >> s.sid)) return std::nullopt;
  std::string skip;
  for (int field = 7; field < 22; ++field)
    if (!(in >> skip)) return std::nullopt;
  if (!(in >> s.start_time)) return std::nullopt;
  return s;
}

std::optional<ProcStat> read_proc_stat(int64_t pid, const std::string& proc_root) {
  std::ifstream f(proc_root + "/" + std::to_string(pid) + "/stat");
  if (!f) return std::nullopt;
  std::string line;
  if (!std::getline(f, line)) return std::nullopt;
  return parse_proc_stat(line);
}

std::optional<int64_t> read_vm_rss_kib(int64_t pid, const std::string& proc_root) {
  std::ifstream f(proc_root + "/" + std::to_string(pid) + "/status");
  if (!f) return std::nullopt;
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("VmRSS:", 0) == 0) {
      try {
        return std::stoll(line.substr(6));  // "VmRSS:     1234 kB"
      } catch (...) {
        return std::nullopt;
      }
    }
  }
  return std::nullopt;
}

std::vector<ProcStat> group_or_session_members(int64_t pgid, int64_t sid, const std::string& proc_root) {
  std::vector<ProcStat> out;
  DIR* d = opendir(proc_root.c_str());
  if (!d) return out;
  while (dirent* e = readdir(d)) {
    if (!std::isdigit(static_cast<unsigned char>(e->d_name[0]))) continue;
    int64_t pid = 0;
    try {
      pid = std::stoll(e->d_name);
    } catch (...) {
      continue;
    }
    auto st = read_proc_stat(pid, proc_root);
    if (!st || st->state == 'Z' || st->state == 'X') continue;
    if ((pgid > 0 && st->pgid == pgid) || (sid > 0 && st->sid == sid)) out.push_back(*st);
  }
  closedir(d);
  return out;
}

}  // namespace servedeck::supervisor
