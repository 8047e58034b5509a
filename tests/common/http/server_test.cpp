// common/http: server and blocking client over loopback (port 0).
#include <doctest/doctest.h>

#include <utility>  // before Boost.Asio: boost 1.74 awaitable.hpp needs std::exchange
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

#include <boost/asio.hpp>
#include <nlohmann/json.hpp>

#include "common/http/client.hpp"
#include "common/http/server.hpp"

using namespace servedeck::http;
using namespace std::chrono_literals;

namespace {

/// Polls `pred` until true or `timeout` passes.
template <class F>
bool wait_for(F pred, std::chrono::milliseconds timeout = 5000ms) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (pred()) return true;
    std::this_thread::sleep_for(2ms);
  }
  return pred();
}

/// Raw socket exchange: writes `bytes`, reads until `until` appears or the peer closes.
std::string raw_exchange(int port, const std::string& bytes, const std::string& until, int reads_needed = 1) {
  boost::asio::io_context ioc;
  boost::asio::ip::tcp::socket s(ioc);
  s.connect({boost::asio::ip::make_address("127.0.0.1"), static_cast<unsigned short>(port)});
  boost::asio::write(s, boost::asio::buffer(bytes));
  std::string got;
  char buf[4096];
  int found = 0;
  while (true) {
    boost::system::error_code ec;
    auto n = s.read_some(boost::asio::buffer(buf), ec);
    got.append(buf, n);
    if (ec) break;
    found = 0;
    for (auto pos = got.find(until); pos != std::string::npos; pos = got.find(until, pos + 1)) ++found;
    if (found >= reads_needed) break;
  }
  return got;
}

}  // namespace

TEST_CASE("server answers a request and the client reads status, headers and body") {
  Server srv({}, [](Request req, std::shared_ptr<Responder> res) {
    nlohmann::json j{{"method", req.method}, {"path", req.path}, {"query", req.query},
                     {"body", req.body}, {"auth", req.header("Authorization")}};
    res->send(201, "application/json", j.dump(), {{"X-Test", "yes"}});
  });
  srv.start();
  REQUIRE(srv.port() > 0);
  ClientRequest cr;
  cr.port = srv.port();
  cr.method = "POST";
  cr.target = "/v1/x?a=1";
  cr.body = "{\"k\":1}";
  cr.headers = {{"Authorization", "Bearer t"}};
  auto r = fetch(cr);
  CHECK(r.status == 201);
  CHECK(r.headers["x-test"] == "yes");
  auto j = nlohmann::json::parse(r.body);
  CHECK(j["method"] == "POST");
  CHECK(j["path"] == "/v1/x");
  CHECK(j["query"] == "a=1");
  CHECK(j["body"] == "{\"k\":1}");
  CHECK(j["auth"] == "Bearer t");
}

// RFC 9112 section 3.2.2: a server must accept the absolute form, which some clients and proxies send.
TEST_CASE("an absolute-form target is served as its origin form: path and query, scheme and authority dropped") {
  Server srv({}, [](Request req, std::shared_ptr<Responder> res) {
    res->send(200, "text/plain", req.path + "|" + req.query + "|" + req.target);
  });
  srv.start();
  const int port = srv.port();
  const std::pair<const char*, const char*> cases[] = {
      {"http://127.0.0.1:9/v1/models?x=1", "/v1/models|x=1|/v1/models?x=1"},
      {"HTTP://example.org/health", "/health||/health"},
      {"https://h", "/||/"},
      {"http://h?q", "/|q|/?q"},
      {"/plain?y", "/plain|y|/plain?y"},
  };
  for (const auto& [target, want] : cases) {
    CAPTURE(target);
    const std::string got = raw_exchange(port, std::string("GET ") + target + " HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n", "\x01");  // read to the close
    CHECK(got.rfind("HTTP/1.1 200", 0) == 0);
    CHECK(got.substr(got.find("\r\n\r\n") + 4) == want);
  }
}

TEST_CASE("keep-alive serves several requests on one connection, pipelined too") {
  std::atomic<int> n{0};
  Server srv({}, [&](Request req, std::shared_ptr<Responder> res) {
    res->send(200, "text/plain", "r" + std::to_string(++n) + req.path);
  });
  srv.start();
  std::string two = "GET /a HTTP/1.1\r\nHost: x\r\n\r\nGET /b HTTP/1.1\r\nHost: x\r\n\r\n";
  auto got = raw_exchange(srv.port(), two, "HTTP/1.1 200", 2);
  // Both answers arrived on one connection, in order.
  auto a = got.find("r1/a");
  auto b = got.find("r2/b");
  CHECK(a != std::string::npos);
  CHECK(b != std::string::npos);
  CHECK(a < b);
}

TEST_CASE("a HEAD response carries the head only, so the next pipelined request is read cleanly") {
  Server srv({}, [](Request req, std::shared_ptr<Responder> res) { res->send(200, "text/plain", "body-of" + req.path); });
  srv.start();
  // HEAD then GET on one connection: were the HEAD body sent, the client would take it for the
  // start of the next response.
  const std::string two = "HEAD /a HTTP/1.1\r\nHost: x\r\n\r\nGET /b HTTP/1.1\r\nHost: x\r\n\r\n";
  const auto got = raw_exchange(srv.port(), two, "body-of/b");
  CHECK(got.find("body-of/a") == std::string::npos);
  CHECK(got.find("Content-Length: 9\r\n") != std::string::npos);  // the HEAD answer names the GET's length
  CHECK(got.find("HTTP/1.1 200") != got.rfind("HTTP/1.1 200"));   // two responses
  ClientRequest cr;
  cr.port = srv.port();
  cr.method = "HEAD";
  cr.target = "/c";
  const auto r = fetch(cr);  // the client does not wait for a body that never comes
  CHECK(r.status == 200);
  CHECK(r.headers.at("content-length") == "9");
  CHECK(r.body.empty());

  // A streaming handler on HEAD: start_stream sends the head alone and reports false; writes
  // fail; the pipelined GET after it is still answered cleanly.
  std::atomic<int> wrote{0};
  Server st({}, [&](Request req, std::shared_ptr<Responder> res) {
    const bool started = res->start_stream(200);
    if (res->write("data: chunk-of" + req.path + "\n\n")) ++wrote;
    res->end();
    if (req.method == "HEAD") CHECK_FALSE(started);
  });
  st.start();
  const auto got2 = raw_exchange(st.port(), "HEAD /s HTTP/1.1\r\nHost: x\r\n\r\nGET /t HTTP/1.1\r\nHost: x\r\n\r\n", "chunk-of/t");
  CHECK(got2.find("chunk-of/s") == std::string::npos);
  CHECK(got2.find("chunk-of/t") != std::string::npos);
  CHECK(wrote == 1);
}

TEST_CASE("a streamed response arrives event by event before it ends") {
  std::mutex mu;
  std::condition_variable cv;
  int released = 0;
  Server srv({}, [&](Request, std::shared_ptr<Responder> res) {
    std::thread([&, res] {
      res->start_stream(200);
      for (int i = 0; i < 3; ++i) {
        res->write("data: " + std::to_string(i) + "\n\n");
        std::unique_lock lk(mu);
        // The next event is produced only after the client saw this one: proves per-event flush.
        cv.wait_for(lk, 5s, [&] { return released > i; });
      }
      res->end();
    }).detach();
  });
  srv.start();
  ClientRequest cr;
  cr.port = srv.port();
  std::string body;
  int status = 0;
  std::map<std::string, std::string> head;
  fetch_stream(
      cr, [&](int s, const std::map<std::string, std::string>& h) { status = s; head = h; },
      [&](std::string_view chunk) {
        body.append(chunk);
        std::lock_guard lk(mu);
        int events = 0;
        for (auto p = body.find("\n\n"); p != std::string::npos; p = body.find("\n\n", p + 1)) ++events;
        released = events;
        cv.notify_all();
        return true;
      });
  CHECK(status == 200);
  CHECK(head["content-type"] == "text/event-stream");
  CHECK(head["cache-control"] == "no-cache");
  CHECK(body == "data: 0\n\ndata: 1\n\ndata: 2\n\n");
}

TEST_CASE("one chunk larger than max_pending_write_bytes reaches a reading client; a client that stops reading is closed") {
  ServerOptions o;
  o.max_pending_write_bytes = 64 * 1024;
  const std::string big(1024 * 1024, 'x');
  std::atomic<int> refused_after{-1};
  Server srv(o, [&](Request req, std::shared_ptr<Responder> res) {
    std::thread([&, res, stuck = req.path == "/stuck"] {
      res->start_stream(200);
      if (!stuck) {
        CHECK(res->write(big));
        res->end();
        return;
      }
      // The client reads nothing: the queue grows past the bound and the connection is closed.
      for (int i = 0; i < 1000; ++i)
        if (!res->write(std::string(64 * 1024, 'y'))) {
          refused_after = i;
          break;
        }
      res->end();
    }).detach();
  });
  srv.start();
  ClientRequest cr;
  cr.port = srv.port();
  std::string body;
  fetch_stream(
      cr, [](int, const std::map<std::string, std::string>&) {},
      [&](std::string_view chunk) {
        body.append(chunk);
        return true;
      });
  CHECK(body.size() == big.size());
  // A stuck client: connected, request sent, nothing read.
  boost::asio::io_context ioc;
  boost::asio::ip::tcp::socket s(ioc);
  s.connect({boost::asio::ip::make_address("127.0.0.1"), static_cast<unsigned short>(srv.port())});
  boost::asio::write(s, boost::asio::buffer(std::string("GET /stuck HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")));
  CHECK(wait_for([&] { return refused_after.load() >= 0; }, 10000ms));
}

TEST_CASE("a body over the limit is answered 413 with the OpenAI envelope") {
  ServerOptions opt;
  opt.max_body_bytes = 100;
  std::atomic<int> called{0};
  Server srv(opt, [&](Request, std::shared_ptr<Responder> res) {
    ++called;
    res->send(200, "text/plain", "ok");
  });
  srv.start();
  ClientRequest cr;
  cr.port = srv.port();
  cr.method = "POST";
  cr.body = std::string(500, 'x');
  auto r = fetch(cr);
  CHECK(r.status == 413);
  auto j = nlohmann::json::parse(r.body);
  CHECK(j["error"]["code"] == "body_too_large");
  CHECK(j["error"]["message"].get<std::string>().find("100 bytes") != std::string::npos);
  CHECK(called == 0);
  // A chunked body (no Content-Length) over the limit too.
  auto got = raw_exchange(srv.port(),
                          "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                          "c8\r\n" + std::string(200, 'y') + "\r\n0\r\n\r\n",
                          "body_too_large");
  CHECK(got.find("HTTP/1.1 413") == 0);
  CHECK(called == 0);
}

TEST_CASE("Expect: 100-continue is honoured") {
  Server srv({}, [](Request req, std::shared_ptr<Responder> res) { res->send(200, "text/plain", req.body); });
  srv.start();
  boost::asio::io_context ioc;
  boost::asio::ip::tcp::socket s(ioc);
  s.connect({boost::asio::ip::make_address("127.0.0.1"), static_cast<unsigned short>(srv.port())});
  boost::asio::write(s, boost::asio::buffer(std::string(
                            "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n")));
  std::string got;
  char buf[512];
  while (got.find("\r\n\r\n") == std::string::npos) got.append(buf, s.read_some(boost::asio::buffer(buf)));
  CHECK(got.find("HTTP/1.1 100 Continue") == 0);
  boost::asio::write(s, boost::asio::buffer(std::string("hello")));
  got.clear();
  while (got.find("hello") == std::string::npos) got.append(buf, s.read_some(boost::asio::buffer(buf)));
  CHECK(got.find("HTTP/1.1 200") == 0);
}

TEST_CASE("a head_check refusal is sent before the body arrives; the handler never sees the request") {
  ServerOptions opt;
  opt.header_timeout_ms = 20000;  // a server that waited for the body would answer nothing for 20 s
  opt.max_body_bytes = 1000;      // the 1 MB announced below is refused by the check first, not 413
  std::atomic<int> handled{0};
  std::mutex mu;
  std::vector<std::string> seen;  // "METHOD path remote-has-port" per checked head
  opt.head_check = [&](const Request& head) -> std::optional<HeadRejection> {
    {
      std::lock_guard lk(mu);
      seen.push_back(head.method + " " + head.path + " " + head.query + " body=" + std::to_string(head.body.size()) +
                     (head.remote_address.rfind("127.0.0.1:", 0) == 0 ? " peer" : " nopeer"));
    }
    if (head.header("authorization") == "Bearer ok") return std::nullopt;
    return HeadRejection{401, R"({"error":"refused"})", {{"WWW-Authenticate", "Bearer"}}};
  };
  Server srv(opt, [&](Request req, std::shared_ptr<Responder> res) {
    ++handled;
    res->send(200, "text/plain", "got " + req.body);
  });
  srv.start();

  // Head only, announcing 1 MB and asking for 100-continue: the refusal comes without waiting.
  auto t0 = std::chrono::steady_clock::now();
  auto got = raw_exchange(srv.port(),
                          "POST /v1/x?q=1 HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\n"
                          "Expect: 100-continue\r\n\r\n",
                          R"({"error":"refused"})");
  auto waited = std::chrono::steady_clock::now() - t0;
  CAPTURE(got);
  CHECK(got.find("HTTP/1.1 401") == 0);
  CHECK(got.find("100 Continue") == std::string::npos);
  CHECK(got.find("WWW-Authenticate: Bearer\r\n") != std::string::npos);
  CHECK(got.find("Connection: close\r\n") != std::string::npos);
  CHECK(waited < 10s);
  CHECK(handled == 0);

  // Head and a 256 KiB body sent at once: the refusal still arrives whole (lingering close, no
  // reset that would discard it) and the body never reaches the handler.
  auto whole = raw_exchange(srv.port(),
                            "POST /v1/y HTTP/1.1\r\nHost: x\r\nContent-Length: 262144\r\n\r\n" +
                                std::string(262144, 'b'),
                            R"({"error":"refused"})");
  CHECK(whole.find("HTTP/1.1 401") == 0);
  CHECK(whole.find(R"({"error":"refused"})") != std::string::npos);
  CHECK(handled == 0);

  // An accepted head: the body is read and the handler runs as before.
  ClientRequest cr;
  cr.port = srv.port();
  cr.method = "POST";
  cr.target = "/v1/z";
  cr.body = "hello";
  cr.headers = {{"Authorization", "Bearer ok"}};
  auto ok = fetch(cr);
  CHECK(ok.status == 200);
  CHECK(ok.body == "got hello");
  CHECK(handled == 1);
  std::lock_guard lk(mu);
  REQUIRE(seen.size() == 3);
  CHECK(seen[0] == "POST /v1/x q=1 body=0 peer");
  CHECK(seen[2] == "POST /v1/z  body=0 peer");
}

TEST_CASE("a head_check that throws is answered 500 and the connection closed") {
  ServerOptions opt;
  opt.head_check = [](const Request&) -> std::optional<HeadRejection> { throw std::runtime_error("boom"); };
  std::atomic<int> handled{0};
  Server srv(opt, [&](Request, std::shared_ptr<Responder> res) {
    ++handled;
    res->send(200, "text/plain", "ok");
  });
  srv.start();
  ClientRequest cr;
  cr.port = srv.port();
  auto r = fetch(cr);
  CHECK(r.status == 500);
  CHECK(nlohmann::json::parse(r.body)["error"]["message"].get<std::string>().find("boom") != std::string::npos);
  CHECK(handled == 0);
}

TEST_CASE("client disconnect mid-stream fires on_disconnect and makes write() fail") {
  std::atomic<bool> disconnected{false};
  std::shared_ptr<Responder> held;
  std::mutex mu;
  Server srv({}, [&](Request, std::shared_ptr<Responder> res) {
    res->on_disconnect([&] { disconnected = true; });
    res->start_stream(200);
    res->write("data: first\n\n");
    std::lock_guard lk(mu);
    held = res;  // the producer keeps the stream open; nothing more is written
  });
  srv.start();
  ClientRequest cr;
  cr.port = srv.port();
  std::string got;
  fetch_stream(cr, nullptr, [&](std::string_view c) {
    got.append(c);
    return false;  // hang up after the first bytes
  });
  CHECK(got == "data: first\n\n");
  REQUIRE(wait_for([&] { return disconnected.load(); }));
  std::shared_ptr<Responder> r;
  {
    std::lock_guard lk(mu);
    r = held;
  }
  REQUIRE(r);
  CHECK(r->client_gone());
  CHECK_FALSE(r->write("data: second\n\n"));
  // A callback registered after the fact runs at once.
  std::atomic<bool> late{false};
  r->on_disconnect([&] { late = true; });
  CHECK(wait_for([&] { return late.load(); }));
}

TEST_CASE("a handler that drops its responder yields 500, not a hang") {
  Server srv({}, [](Request, std::shared_ptr<Responder>) {});
  srv.start();
  ClientRequest cr;
  cr.port = srv.port();
  auto r = fetch(cr);
  CHECK(r.status == 500);
  CHECK(nlohmann::json::parse(r.body)["error"]["code"] == "no_response");
}

TEST_CASE("idle keep-alive connections are closed after idle_timeout_ms") {
  ServerOptions opt;
  opt.idle_timeout_ms = 100;
  Server srv(opt, [](Request, std::shared_ptr<Responder> res) { res->send(200, "text/plain", "ok"); });
  srv.start();
  auto t0 = std::chrono::steady_clock::now();
  auto got = raw_exchange(srv.port(), "GET / HTTP/1.1\r\nHost: x\r\n\r\n", "never-appears");
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
  CHECK(got.find("HTTP/1.1 200") == 0);
  CHECK(ms >= 90);
  CHECK(ms < 5000);
}

TEST_CASE("client errors name the target and cause; post_blocking runs work") {
  Server srv({}, [](Request, std::shared_ptr<Responder>) {});
  srv.start();
  int port = srv.port();
  std::atomic<bool> ran{false};
  CHECK(srv.post_blocking([&] { ran = true; }));
  CHECK(wait_for([&] { return ran.load(); }));
  srv.stop();
  ClientRequest cr;
  cr.port = port;
  cr.target = "/health";
  try {
    fetch(cr);
    FAIL("expected ClientError");
  } catch (const ClientError& e) {
    std::string what = e.what();
    CHECK(what.find("/health") != std::string::npos);
    CHECK(what.find("connect") != std::string::npos);
  }
  // Binding an occupied port fails with ServerError naming it.
  Server a({}, [](Request, std::shared_ptr<Responder> res) { res->send(200, "text/plain", ""); });
  a.start();
  ServerOptions opt;
  opt.port = a.port();
  Server b(opt, [](Request, std::shared_ptr<Responder> res) { res->send(200, "text/plain", ""); });
  CHECK_THROWS_AS(b.start(), ServerError);
}

TEST_CASE("a read timeout bounds fetch()") {
  std::shared_ptr<Responder> held;
  std::mutex mu;
  Server srv({}, [&](Request, std::shared_ptr<Responder> res) {
    std::lock_guard lk(mu);
    held = res;  // never answers
  });
  srv.start();
  ClientRequest cr;
  cr.port = srv.port();
  cr.timeout_ms = 150;
  auto t0 = std::chrono::steady_clock::now();
  CHECK_THROWS_AS(fetch(cr), ClientError);
  CHECK(std::chrono::steady_clock::now() - t0 < 3s);
  std::lock_guard lk(mu);
  held.reset();
}

TEST_CASE("on_disconnect registered after the server stopped still runs") {
  // A handler in flight while stop() runs registers its cancel callback too late to be queued:
  // it must run at once, not be dropped (the producer would never be cancelled).
  std::shared_ptr<Responder> held;
  std::mutex mu;
  Server srv({}, [&](Request, std::shared_ptr<Responder> res) {
    res->start_stream(200);
    res->write("data: first\n\n");
    std::lock_guard lk(mu);
    held = res;
  });
  srv.start();
  std::thread client([&] {
    ClientRequest cr;
    cr.port = srv.port();
    try {
      fetch_stream(cr, nullptr, [](std::string_view) { return true; });
    } catch (const ClientError&) {
      // the server closed the connection mid-stream
    }
  });
  REQUIRE(wait_for([&] {
    std::lock_guard lk(mu);
    return held != nullptr;
  }));
  srv.stop();
  client.join();
  std::shared_ptr<Responder> r;
  {
    std::lock_guard lk(mu);
    r = held;
  }
  CHECK(r->client_gone());
  std::atomic<bool> ran{false};
  r->on_disconnect([&] { ran = true; });
  CHECK(ran.load());
}
