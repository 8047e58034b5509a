// common/http: an exception outside the request handler — in a blocking task, or in a callback an
// I/O thread runs — ends that piece of work only; the server keeps answering.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>

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
