// common/http: an exception outside the request handler — in a blocking task, or in a callback an
// I/O thread runs — ends that piece of work only; the server keeps answering. Out of descriptors,
// the accept loop waits and resumes.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/http/client.hpp"
#include "common/http/server.hpp"

using namespace servedeck::http;
using namespace std::chrono_literals;

namespace {

bool eventually(const std::function<bool()>& pred) {
  auto deadline = std::chrono::steady_clock::now() + 5s;
  while (std::chrono::steady_clock::now() < deadline) {
    if (pred()) return true;
    std::this_thread::sleep_for(5ms);
  }
  return pred();
}

ClientResponse get(int port, const std::string& target) {
  ClientRequest r;
  r.port = port;
  r.target = target;
  r.timeout_ms = 5000;
  return fetch(r);
}

}  // namespace

TEST_CASE("a blocking task that throws fails its request only; the pool runs the next task") {
  Server* srv_ptr = nullptr;
  Server srv({}, [&srv_ptr](Request req, std::shared_ptr<Responder> res) {
    if (req.path == "/throw") {
      // e.g. a SQLite error in a status call, or nlohmann's type_error on a cut UTF-8 character
      srv_ptr->post_blocking([res] { throw std::runtime_error("database is locked (injected)"); });
      return;
    }
    srv_ptr->post_blocking([res] { res->send(200, "text/plain", "ok"); });
  });
  srv_ptr = &srv;
  srv.start();
  for (int i = 0; i < 3; ++i) {
    auto failed = get(srv.port(), "/throw");
    CHECK(failed.status == 500);  // the dropped responder answers: nothing hangs
    CHECK(nlohmann::json::parse(failed.body)["error"]["code"] == "no_response");
    auto ok = get(srv.port(), "/next");
    CHECK(ok.status == 200);
    CHECK(ok.body == "ok");
  }
}

TEST_CASE("a disconnect callback that throws does not take the I/O thread down") {
  std::atomic<int> thrown{0};
  Server srv({}, [&thrown](Request req, std::shared_ptr<Responder> res) {
    if (req.path == "/hang") {
      res->on_disconnect([&thrown, res] {
        ++thrown;
        throw std::runtime_error("cancel failed (injected)");
      });
      return;  // never answered; the client gives up
    }
    res->send(200, "text/plain", "ok");
  });
  srv.start();
  for (int i = 0; i < 4; ++i) {  // more than the server's I/O threads
    ClientRequest r;
    r.port = srv.port();
    r.target = "/hang";
    r.timeout_ms = 200;
    CHECK_THROWS_AS(fetch(r), ClientError);
  }
  CHECK(eventually([&] { return thrown.load() == 4; }));
  auto ok = get(srv.port(), "/after");
  CHECK(ok.status == 200);
  CHECK(ok.body == "ok");
}

namespace {

/// CPU time (user + system) this process has used, seconds.
double cpu_seconds() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

/// The child of the test below: 0 when the server neither spins while out of descriptors nor
/// stays deaf once they are back; 2 + a reason's number otherwise.
int out_of_descriptors_child() {
  rlimit lim{64, 64};
  if (::setrlimit(RLIMIT_NOFILE, &lim) != 0) return 2;
  Server srv({}, [](Request, std::shared_ptr<Responder> res) { res->send(200, "text/plain", "ok"); });
  srv.start();
  // A connection the kernel completes into the backlog, then every descriptor taken: the
  // server's accept of it fails with EMFILE.
  int client = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(srv.port()));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (client < 0 || ::connect(client, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) return 3;
  std::vector<int> fillers;
  for (int fd; (fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC)) >= 0;) fillers.push_back(fd);
  if (errno != EMFILE) return 4;
  const double cpu0 = cpu_seconds();
  std::this_thread::sleep_for(1s);
  const double spent = cpu_seconds() - cpu0;
  // The descriptors come back: the waiting connection is accepted and answered.
  for (int fd : fillers) ::close(fd);
  const std::string ask = "GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
  if (::send(client, ask.data(), ask.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(ask.size())) return 5;
  timeval tv{3, 0};
  ::setsockopt(client, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  char buf[256];
  const ssize_t n = ::recv(client, buf, sizeof buf, 0);
  ::close(client);
  if (n < 12 || std::string(buf, 12) != "HTTP/1.1 200") return 6;
  // note: an accept loop that retries at once burns a whole core here (~1 s in 1 s).
  return spent < 0.3 ? 0 : 7;
}

}  // namespace

TEST_CASE("out of descriptors, the accept loop waits instead of spinning, and resumes once they are back") {
  // In a child process: the descriptor limit is the whole process's.
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) ::_exit(out_of_descriptors_child());
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  REQUIRE(WIFEXITED(status));
  // 2 setrlimit, 3 connect, 4 the limit was not reached, 5 send, 6 no answer, 7 the loop spun
  CHECK(WEXITSTATUS(status) == 0);
}
