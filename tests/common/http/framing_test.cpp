// common/http: how a request body and a streamed response are framed — transfer codings other
// than chunked refused with 501, and an HTTP/1.0 client's stream delimited by the connection's
// close instead of chunks (a 1.0 client cannot read chunked coding).
#include <doctest/doctest.h>

#include <utility>  // before Boost.Asio: boost 1.74 awaitable.hpp needs std::exchange
#include <string>

#include <boost/asio.hpp>

#include "common/http/server.hpp"

using namespace servedeck::http;

namespace {

/// Writes `bytes` on a fresh loopback connection and reads until the server closes it (or 5 s).
std::string exchange_until_close(int port, const std::string& bytes) {
  boost::asio::io_context ioc;
  boost::asio::ip::tcp::socket s(ioc);
  s.connect({boost::asio::ip::make_address("127.0.0.1"), static_cast<unsigned short>(port)});
  const timeval tv{5, 0};
  ::setsockopt(s.native_handle(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  boost::asio::write(s, boost::asio::buffer(bytes));
  std::string got;
  char buf[4096];
  while (true) {
    boost::system::error_code ec;
    const auto n = s.read_some(boost::asio::buffer(buf), ec);
    got.append(buf, n);
    if (ec) break;
  }
  return got;
}

}  // namespace

TEST_CASE("a request body in a transfer coding other than chunked is refused with 501, never read as plain") {
  int handled = 0;
  Server srv({}, [&](Request req, std::shared_ptr<Responder> res) {
    ++handled;
    res->send(200, "text/plain", "got:" + req.body);
  });
  srv.start();
  for (const char* te : {"gzip, chunked", "identity", "gzip", "chunked, chunked"}) {
    INFO(te);
    const std::string req = std::string("POST /x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: ") + te +
                            "\r\n\r\n5\r\nhello\r\n0\r\n\r\n";
    const std::string got = exchange_until_close(srv.port(), req);
    CHECK(got.rfind("HTTP/1.1 501", 0) == 0);
    CHECK(got.find("unsupported_transfer_encoding") != std::string::npos);
    CHECK(got.find(std::string("Transfer-Encoding '") + te + "' is not supported") != std::string::npos);
  }
  CHECK(handled == 0);
  // chunked itself (any case) is read.
  const std::string ok = exchange_until_close(
      srv.port(), "POST /x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: Chunked\r\nConnection: close\r\n\r\n5\r\nhello\r\n0\r\n\r\n");
  CHECK(ok.rfind("HTTP/1.1 200", 0) == 0);
  CHECK(ok.find("got:hello") != std::string::npos);
  CHECK(handled == 1);
}

TEST_CASE("an HTTP/1.0 client's stream is close-delimited: no chunked coding, the bytes as written, then the close") {
  Server srv({}, [](Request, std::shared_ptr<Responder> res) {
    res->start_stream(200);
    res->write("data: one\n\n");
    res->write("data: two\n\n");
    res->end();
  });
  srv.start();
  const std::string got = exchange_until_close(srv.port(), "GET /s HTTP/1.0\r\nHost: x\r\nConnection: keep-alive\r\n\r\n");
  const auto head_end = got.find("\r\n\r\n");
  REQUIRE(head_end != std::string::npos);
  const std::string head = got.substr(0, head_end);
  CHECK(head.find("Transfer-Encoding") == std::string::npos);
  CHECK(head.find("Connection: close") != std::string::npos);
  CHECK(got.substr(head_end + 4) == "data: one\n\ndata: two\n\n");  // and the read ended: the server closed
  // HTTP/1.1 on the same server still gets chunks.
  const std::string chunked = exchange_until_close(srv.port(), "GET /s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  CHECK(chunked.find("Transfer-Encoding: chunked") != std::string::npos);
  CHECK(chunked.find("b\r\ndata: one\n\n\r\n") != std::string::npos);
}
