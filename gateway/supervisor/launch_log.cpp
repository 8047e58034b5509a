#include "gateway/supervisor/launch_log.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <utility>

namespace servedeck::supervisor {

namespace fs = std::filesystem;

namespace {

int64_t file_size(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 ? static_cast<int64_t>(st.st_size) : 0;
}

/// Reads the last `max_bytes` of `path`.
std::string read_tail_bytes(const std::string& path, int64_t max_bytes) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return {};
  f.seekg(0, std::ios::end);
  int64_t size = f.tellg();
  int64_t start = std::max<int64_t>(0, size - max_bytes);
  f.seekg(start);
  std::string s(static_cast<std::size_t>(size - start), '\0');
  f.read(s.data(), static_cast<std::streamsize>(s.size()));
  s.resize(static_cast<std::size_t>(f.gcount()));
  return s;
}

}  // namespace

LaunchLog::LaunchLog(const std::string& state_dir, const std::string& model, int64_t launch_id,
                     int64_t max_bytes, int keep)
    : max_bytes_(max_bytes) {
  fs::path dir = fs::path(state_dir) / "logs";
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw std::runtime_error("log directory " + dir.string() + ": " + ec.message());
  path_ = (dir / (model + "-" + std::to_string(launch_id) + ".log")).string();
  fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0640);
  if (fd_ < 0) throw std::runtime_error("launch log " + path_ + ": cannot open: " + std::strerror(errno));
  auto logs = launch_logs_of(dir.string(), model);
  if (keep > 0 && static_cast<int>(logs.size()) > keep) {
    for (std::size_t i = 0; i + static_cast<std::size_t>(keep) < logs.size(); ++i) {
      if (logs[i] == path_) continue;
      fs::remove(logs[i], ec);
      fs::remove(logs[i] + ".1", ec);
    }
  }
}

LaunchLog::LaunchLog(const std::string& path, int64_t max_bytes) : path_(path), max_bytes_(max_bytes) {}

LaunchLog::~LaunchLog() {
  if (fd_ >= 0) ::close(fd_);
}

void LaunchLog::note(const std::string& line) {
  std::string s = "servedeck: " + line + "\n";
  int fd = fd_ >= 0 ? fd_ : ::open(path_.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC);
  if (fd < 0) return;
  ssize_t n = ::write(fd, s.data(), s.size());
  (void)n;  // best effort: a log note never fails a launch
  if (fd != fd_) ::close(fd);
}

bool LaunchLog::enforce_bound() {
  std::lock_guard lk(mu_);
  int64_t size = file_size(path_);
  if (max_bytes_ <= 0 || size <= max_bytes_) return false;
  std::error_code ec;
  fs::copy_file(path_, path_ + ".1", fs::copy_options::overwrite_existing, ec);
  if (ec) return false;
  if (::truncate(path_.c_str(), 0) != 0) return false;
  rotated_bytes_ += size;
  return true;
}

int64_t LaunchLog::bytes_written() const {
  std::lock_guard lk(mu_);
  return rotated_bytes_ + file_size(path_);
}

std::string tail_lines(const std::string& path, int lines) {
  constexpr int64_t k_max = 1 << 20;
  std::string text = read_tail_bytes(path, k_max);
  auto count = [](const std::string& s) { return std::count(s.begin(), s.end(), '\n'); };
  if (count(text) < lines) text = read_tail_bytes(path + ".1", k_max) + text;
  if (text.empty()) return {};
  // Walk back `lines` newlines (ignoring a trailing one).
  std::size_t end = text.size();
  if (text.back() == '\n') --end;
  std::size_t pos = end;
  int seen = 0;
  while (pos > 0) {
    if (text[pos - 1] == '\n' && ++seen == lines) break;
    --pos;
  }
  return text.substr(pos, end - pos);
}

std::vector<std::string> launch_logs_of(const std::string& log_dir, const std::string& model) {
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(log_dir, ec)) {
    std::string name = e.path().filename().string();
    std::string prefix = model + "-";
    if (name.rfind(prefix, 0) != 0 || name.size() < prefix.size() + 5 || name.substr(name.size() - 4) != ".log")
      continue;
    std::string id = name.substr(prefix.size(), name.size() - prefix.size() - 4);
    if (id.empty() || !std::all_of(id.begin(), id.end(), [](char c) { return c >= '0' && c <= '9'; })) continue;
    found.emplace_back(std::stoll(id), e.path().string());
  }
  std::sort(found.begin(), found.end());
  std::vector<std::string> out;
  for (auto& f : found) out.push_back(f.second);
  return out;
}

}  // namespace servedeck::supervisor
