#include <doctest/doctest.h>

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "gateway/service/notify.hpp"

// Plays systemd: binds a datagram socket, points NOTIFY_SOCKET at it, and reads what the daemon sends.
TEST_CASE("notify_ready and notify_status reach $NOTIFY_SOCKET") {
#if !SERVEDECK_TEST_HAVE_LIBSYSTEMD
  std::exit(77);  // built without libsystemd: nothing to test (skipped)
#endif
  char dir[] = "/tmp/servedeck-notify-XXXXXX";
  REQUIRE(mkdtemp(dir) != nullptr);
  std::string path = std::string(dir) + "/notify.sock";
  int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  REQUIRE(fd >= 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  path.copy(addr.sun_path, sizeof(addr.sun_path) - 1);
  REQUIRE(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  timeval tv{2, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setenv("NOTIFY_SOCKET", path.c_str(), 1);

  servedeck::service::notify_ready("serving on 127.0.0.1:8090");
  char buf[256] = {};
  ssize_t n = recv(fd, buf, sizeof buf - 1, 0);
  REQUIRE(n > 0);
  CHECK(std::string(buf, static_cast<std::size_t>(n)) == "READY=1\nSTATUS=serving on 127.0.0.1:8090");

  servedeck::service::notify_status("switching to glm53: preflight");
  n = recv(fd, buf, sizeof buf - 1, 0);
  REQUIRE(n > 0);
  CHECK(std::string(buf, static_cast<std::size_t>(n)) == "STATUS=switching to glm53: preflight");

  unsetenv("NOTIFY_SOCKET");
  close(fd);
  unlink(path.c_str());
  rmdir(dir);
}
