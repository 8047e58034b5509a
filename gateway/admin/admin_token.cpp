#include "gateway/admin/admin_token.hpp"

#include <fcntl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <stdexcept>

namespace servedeck::admin {

namespace {

constexpr std::size_t k_token_bytes = 32;
constexpr std::size_t k_max_file_bytes = 1024;

bool well_formed(const std::string& t) {
  if (t.size() != 2 * k_token_bytes) return false;
  for (char c : t)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  return true;
}

}  // namespace

std::string admin_token_path(const std::string& state_dir) {
  return (std::filesystem::path(state_dir) / "admin.token").string();
}

std::string new_admin_token() {
  unsigned char bytes[k_token_bytes];
  std::size_t got = 0;
  while (got < sizeof bytes) {
    ssize_t n = ::getrandom(bytes + got, sizeof bytes - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw std::runtime_error(std::string("admin token: getrandom failed: ") + std::strerror(errno));
    got += static_cast<std::size_t>(n);
  }
  static constexpr char hex[] = "0123456789abcdef";
  std::string out;
  for (unsigned char b : bytes) {
    out += hex[b >> 4];
    out += hex[b & 15];
  }
  return out;
}

void write_admin_token(const std::string& state_dir, const std::string& token) {
  const std::string path = admin_token_path(state_dir);
  const std::string tmp = path + ".tmp";
  auto fail = [&](const std::string& what) {
    int e = errno;
    ::unlink(tmp.c_str());
    throw std::runtime_error("admin token " + path + ": " + what + ": " + std::strerror(e));
  };
  ::unlink(tmp.c_str());  // a temporary left by a daemon that died mid-write
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0640);
  if (fd < 0) fail("cannot create " + tmp);
  if (::fchmod(fd, 0640) != 0) {  // independent of the umask
    ::close(fd);
    fail("chmod 0640");
  }
  const std::string text = token + "\n";
  std::size_t off = 0;
  while (off < text.size()) {
    ssize_t n = ::write(fd, text.data() + off, text.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      ::close(fd);
      fail("write");
    }
    off += static_cast<std::size_t>(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) fail("fsync/close");
  if (::rename(tmp.c_str(), path.c_str()) != 0) fail("rename");
}

std::optional<std::string> read_admin_token(const std::string& state_dir, std::string& why) {
  const std::string path = admin_token_path(state_dir);
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) {
    why = errno == ENOENT ? "no " + path : "cannot read " + path + ": " + std::strerror(errno);
    return std::nullopt;
  }
  char buf[k_max_file_bytes];
  ssize_t n = ::read(fd, buf, sizeof buf);
  ::close(fd);
  std::string t = n > 0 ? std::string(buf, static_cast<std::size_t>(n)) : std::string();
  while (!t.empty() && (t.back() == '\n' || t.back() == '\r' || t.back() == ' ')) t.pop_back();
  if (!well_formed(t)) {
    why = path + " is empty or malformed (expected " + std::to_string(2 * k_token_bytes) + " hex digits)";
    return std::nullopt;
  }
  return t;
}

void remove_admin_token(const std::string& state_dir, const std::string& token) {
  std::string why;
  if (auto t = read_admin_token(state_dir, why); t && *t == token) ::unlink(admin_token_path(state_dir).c_str());
}

}  // namespace servedeck::admin
