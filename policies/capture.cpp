#include "policies/capture.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <vector>

#include "common/json_limits.hpp"

namespace servedeck::policies {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

std::mutex& capture_mutex() {
  static std::mutex m;
  return m;
}

CaptureOptions& global_options() {
  static CaptureOptions o = [] {
    CaptureOptions d;
    const char* env = std::getenv("SERVEDECK_CAPTURE_DIR");
    d.dir = env && *env ? env : "/var/lib/servedeck/capture";
    return d;
  }();
  return o;
}

std::string safe_name(std::string_view s) {
  std::string out;
  for (char c : s) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_' || c == '.';
    out.push_back(ok ? c : '_');
  }
  return out.empty() ? "model" : out;
}

std::string errno_text(int e) { return std::strerror(e); }

/// Deletes capture's own files beyond the limits. The caller holds capture_mutex().
std::size_t apply_retention(const CaptureOptions& o) {
  std::error_code ec;
  struct File {
    fs::path path;
    fs::file_time_type time;
  };
  std::vector<File> files;
  for (const auto& e : fs::directory_iterator(o.dir, ec)) {
    if (!is_capture_file_name(e.path().filename().string())) continue;
    struct stat st {};
    // lstat: a link named like a capture is not one (and what it points at is not ours to delete).
    if (::lstat(e.path().c_str(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != ::geteuid()) continue;
    files.push_back({e.path(), e.last_write_time(ec)});
  }
  std::sort(files.begin(), files.end(), [](const File& a, const File& b) {
    return a.time != b.time ? a.time < b.time : a.path < b.path;
  });
  auto now = fs::file_time_type::clock::now();
  std::size_t excess = files.size() > o.max_files ? files.size() - o.max_files : 0;
  std::size_t deleted = 0;
  for (std::size_t i = 0; i < files.size(); ++i) {
    if (i < excess || now - files[i].time > o.max_age) deleted += fs::remove(files[i].path, ec) ? 1 : 0;
  }
  return deleted;
}

}  // namespace

bool is_capture_file_name(std::string_view name) {
  constexpr std::string_view ext = ".json";
  if (name.size() <= ext.size() || name.substr(name.size() - ext.size()) != ext) return false;
  name.remove_suffix(ext.size());
  for (int field = 0; field < 3; ++field) {  // <unix ms>-<pid>-<seq>-
    std::size_t digits = 0;
    while (digits < name.size() && name[digits] >= '0' && name[digits] <= '9') ++digits;
    if (digits == 0 || digits > 20 || digits >= name.size() || name[digits] != '-') return false;
    name.remove_prefix(digits + 1);
  }
  if (name.empty()) return false;
  for (char c : name) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_' || c == '.';
    if (!ok) return false;
  }
  return true;
}

std::size_t apply_capture_retention(const CaptureOptions& options) {
  std::lock_guard lock(capture_mutex());
  return apply_retention(options);
}

std::size_t apply_capture_retention() {
  CaptureOptions o;
  {
    std::lock_guard lock(capture_mutex());
    o = global_options();
  }
  return apply_capture_retention(o);
}

void configure_capture(CaptureOptions options) {
  std::lock_guard lock(capture_mutex());
  global_options() = std::move(options);
}

bool capture_enabled(const registry::ModelEntry& model) {
  const char* env = std::getenv("SERVEDECK_CAPTURE");
  return model.policies.capture && env && std::string_view(env) == "1";
}

CaptureResult capture_exchange(const registry::ModelEntry& model, const json& request, const json& response) {
  CaptureOptions o;
  {
    std::lock_guard lock(capture_mutex());
    o = global_options();
  }
  return capture_exchange(model, request, response, o);
}

CaptureResult capture_exchange(const registry::ModelEntry& model, const json& request, const json& response,
                               const CaptureOptions& o) {
  CaptureResult result;
  if (!capture_enabled(model)) return result;
  std::lock_guard lock(capture_mutex());
  if (::mkdir(o.dir.c_str(), 0700) != 0 && errno != EEXIST) {
    result.error = "capture: cannot create directory '" + o.dir + "': " + errno_text(errno);
    return result;
  }
  struct stat st {};
  if (::stat(o.dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    result.error = "capture: '" + o.dir + "' is not a directory";
    return result;
  }
  if ((st.st_mode & 0777) != 0700 && ::chmod(o.dir.c_str(), 0700) != 0) {
    result.error = "capture: cannot chmod 0700 '" + o.dir + "': " + errno_text(errno);
    return result;
  }
  static std::atomic<uint64_t> seq{0};
  auto now_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                    std::chrono::system_clock::now().time_since_epoch()).count();
  std::string path = o.dir + "/" + std::to_string(now_ms) + "-" + std::to_string(::getpid()) + "-" +
                     std::to_string(seq++) + "-" + safe_name(model.name) + ".json";
  json doc = {{"model", model.name}, {"time_unix_ms", now_ms}, {"request", request}, {"response", response}};
  std::string text = dump_safe(doc) + "\n";
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) {
    result.error = "capture: cannot create '" + path + "': " + errno_text(errno);
    return result;
  }
  ::fchmod(fd, 0600);  // independent of the umask
  std::size_t off = 0;
  while (off < text.size()) {
    ssize_t n = ::write(fd, text.data() + off, text.size() - off);
    if (n < 0) {
      if (errno == EINTR) continue;
      result.error = "capture: write to '" + path + "' failed: " + errno_text(errno);
      ::close(fd);
      return result;
    }
    off += static_cast<std::size_t>(n);
  }
  ::close(fd);
  result.path = path;
  apply_retention(o);
  return result;
}

}  // namespace servedeck::policies
