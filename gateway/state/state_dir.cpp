#include "gateway/state/state_dir.hpp"

#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "gateway/state/store.hpp"

namespace servedeck::state {

namespace fs = std::filesystem;

namespace {

std::string octal(unsigned mode) {
  char b[8];
  std::snprintf(b, sizeof b, "%04o", mode & 07777u);
  return b;
}

bool same_dir(const std::string& a, const std::string& b) {
  std::error_code ec1, ec2;
  auto ca = fs::weakly_canonical(a, ec1), cb = fs::weakly_canonical(b, ec2);
  if (ec1 || ec2) return fs::path(a).lexically_normal() == fs::path(b).lexically_normal();
  return ca == cb;
}

/// The unit's StateDirectory (the first of $STATE_DIRECTORY's colon-separated entries), or "".
std::string systemd_state_directory() {
  const char* e = std::getenv("STATE_DIRECTORY");
  if (!e || !*e) return "";
  std::string s = e;
  return s.substr(0, s.find(':'));
}

}  // namespace

std::string secure_state_dir(const std::string& dir) {
  std::error_code ec;
  fs::path p(dir);
  if (!fs::exists(p, ec)) {
    if (p.has_parent_path()) fs::create_directories(p.parent_path(), ec);
    if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST)
      throw StoreError("state directory '" + dir + "': cannot create: " + std::strerror(errno));
  }
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0)
    throw StoreError("state directory '" + dir + "': " + std::strerror(errno));
  if (!S_ISDIR(st.st_mode)) throw StoreError("state directory '" + dir + "' is not a directory");
  const unsigned mode = st.st_mode & 07777u;
  const bool unit = !systemd_state_directory().empty() && same_dir(systemd_state_directory(), dir);
  const unsigned target = unit ? (mode & 0710u) | 0700u : 0700u;
  if (mode == target) return "";
  if (::chmod(dir.c_str(), target) != 0)
    throw StoreError("state directory '" + dir + "' is " + octal(mode) + " and cannot be made " + octal(target) +
                     ": " + std::strerror(errno));
  return "state directory " + dir + " was " + octal(mode) + "; now " + octal(target);
}

std::optional<std::string> systemd_state_dir_mismatch(const std::string& dir, const std::string& config_path) {
  const std::string unit_dir = systemd_state_directory();
  if (unit_dir.empty() || same_dir(unit_dir, dir)) return std::nullopt;
  return "the systemd unit's StateDirectory is " + unit_dir + " but the state directory is " + dir +
         " (server.state_dir of " + config_path + ", or --state-dir / $SERVEDECK_STATE_DIR); the CLI finds the "
         "daemon through server.state_dir, so set state_dir = \"" + unit_dir + "\" in " + config_path;
}

}  // namespace servedeck::state
