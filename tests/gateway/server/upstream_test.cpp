// start_upstream against a raw TCP engine that writes its answer byte for byte: interim 1xx
// responses (100 Continue, 103 Early Hints; RFC 9110 section 15.2) before the final one are
// skipped, a 101 or more than 8 of them end the call naming it. Regression: the first 1xx head
// was taken for the final response (the client got 502 engine_http_100).
#include <doctest/doctest.h>

#include <utility>  // before Boost.Asio: boost 1.74 awaitable.hpp needs std::exchange

#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <thread>

#include <boost/asio.hpp>

#include "gateway/server/upstream.hpp"

namespace {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using servedeck::gateway::UpstreamFailure;

/// Listens on 127.0.0.1, port 0; answers one connection with `answer` once the request's head
/// and Content-Length body are read, then closes it.
class RawEngine {
 public:
  explicit RawEngine(std::string answer)
      : acceptor_(io_, tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0)), answer_(std::move(answer)) {
    thread_ = std::thread([this] { serve(); });
  }
  ~RawEngine() {
    // note: closing the acceptor does not wake a blocked accept() on Linux; a connection does
    // (harmless when the one expected came: serve() accepts once).
    boost::system::error_code ignored;
    asio::io_context io;
    tcp::socket poke(io);
    poke.connect(acceptor_.local_endpoint(), ignored);
    poke.close(ignored);
    thread_.join();
    acceptor_.close(ignored);
  }
  int port() const { return acceptor_.local_endpoint().port(); }

 private:
  void serve() {
    boost::system::error_code ec;
    tcp::socket s(io_);
    acceptor_.accept(s, ec);
    if (ec) return;
    std::string got;
    char buf[4096];
    std::size_t need = std::string::npos;  // bytes of the whole request, once its head is read
    while (need == std::string::npos || got.size() < need) {
      const std::size_t n = s.read_some(asio::buffer(buf), ec);
      if (ec) return;
      got.append(buf, n);
      const auto head_end = got.find("\r\n\r\n");
      if (need == std::string::npos && head_end != std::string::npos) {
        std::size_t length = 0;
        if (auto at = got.find("Content-Length: "); at != std::string::npos && at < head_end)
          length = std::stoul(got.substr(at + 16));
        need = head_end + 4 + length;
      }
    }
    asio::write(s, asio::buffer(answer_), ec);
    s.shutdown(tcp::socket::shutdown_both, ec);
  }

  asio::io_context io_;
  tcp::acceptor acceptor_;
  std::string answer_;
  std::thread thread_;
};

struct Outcome {
  std::optional<int> status;
  std::map<std::string, std::string> headers;
  std::string body;
  std::optional<UpstreamFailure> failure;
  std::string detail;
};

/// One POST to `engine`, run to its end (or a 10 s deadline).
Outcome call(const RawEngine& engine) {
  asio::io_context io;
  servedeck::gateway::UpstreamRequest req;
  req.port = engine.port();
  req.target = "/v1/chat/completions";
  req.body = R"({"stream":true})";
  Outcome out;
  servedeck::gateway::UpstreamCallbacks cb;
  cb.on_head = [&](int status, const std::map<std::string, std::string>& h) {
    out.status = status;
    out.headers = h;
  };
  cb.on_data = [&](std::string_view bytes) { out.body.append(bytes); };
  cb.on_end = [&](UpstreamFailure f, const std::string& detail) {
    out.failure = f;
    out.detail = detail;
  };
  auto handle = servedeck::gateway::start_upstream(io.get_executor(), req, std::move(cb));
  io.run_for(std::chrono::seconds(10));
  return out;
}

const std::string k_final =
    "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: 14\r\n\r\ndata: [DONE]\n\n";

}  // namespace

TEST_CASE("interim 1xx responses before the final one are skipped: 100 Continue, 103 Early Hints, several") {
  for (const std::string& interim :
       {std::string("HTTP/1.1 100 Continue\r\n\r\n"),
        std::string("HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n\r\n"),
        std::string("HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 102 Processing\r\n\r\n")}) {
    CAPTURE(interim);
    RawEngine engine(interim + k_final);
    const Outcome o = call(engine);
    CAPTURE(o.detail);
    REQUIRE(o.failure.has_value());
    CHECK(*o.failure == UpstreamFailure::none);
    CHECK(o.status == 200);
    CHECK(o.headers.at("content-type") == "text/event-stream");
    CHECK(o.headers.count("link") == 0);  // an interim head's fields are not the answer's
    CHECK(o.body == "data: [DONE]\n\n");
  }
}

TEST_CASE("eight interim responses are skipped; a ninth ends the call naming the bound") {
  std::string eight;
  for (int i = 0; i < 8; ++i) eight += "HTTP/1.1 100 Continue\r\n\r\n";
  {
    RawEngine engine(eight + k_final);
    const Outcome o = call(engine);
    CHECK(o.status == 200);
    CHECK(o.failure == UpstreamFailure::none);
  }
  RawEngine engine(eight + "HTTP/1.1 103 Early Hints\r\n\r\n" + k_final);
  const Outcome o = call(engine);
  CHECK_FALSE(o.status.has_value());
  CHECK(o.failure == UpstreamFailure::io);
  CHECK(o.detail.find("more than 8 interim 1xx responses") != std::string::npos);
  CHECK(o.detail.find("(the last: 103)") != std::string::npos);
}

TEST_CASE("101 Switching Protocols from an engine ends the call naming it") {
  RawEngine engine("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n" + k_final);
  const Outcome o = call(engine);
  CHECK_FALSE(o.status.has_value());
  CHECK(o.failure == UpstreamFailure::io);
  CHECK(o.detail.find("101 Switching Protocols") != std::string::npos);
}
