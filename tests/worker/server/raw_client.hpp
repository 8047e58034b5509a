// A minimal blocking HTTP/1.1 client on a raw Asio socket for the streaming tests: sends one
// POST with Connection: close, parses the status line, de-chunks a chunked body as it arrives
// and hands the bytes to a callback that may stop early (the socket is then closed, as a client
// that goes away does).
#pragma once

#include <functional>
#include <stdexcept>
#include <string>
#include <string_view>

#include <boost/asio.hpp>

namespace servedeck::worker::testing {

/// Returns the status; `on_body` gets de-chunked body bytes and returns false to hang up.
inline int raw_post_stream(int port, const std::string& target, const std::string& body,
                           const std::function<bool(std::string_view)>& on_body) {
  namespace asio = boost::asio;
  asio::io_context io;
  asio::ip::tcp::socket sock(io);
  sock.connect({asio::ip::make_address("127.0.0.1"), static_cast<unsigned short>(port)});
  const std::string req = "POST " + target + " HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                          "Connection: close\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
  asio::write(sock, asio::buffer(req));
  std::string buf;
  char tmp[4096];
  int status = 0;
  bool chunked = false, in_body = false;
  auto read_more = [&]() -> bool {
    boost::system::error_code ec;
    const std::size_t n = sock.read_some(asio::buffer(tmp), ec);
    if (ec || n == 0) return false;
    buf.append(tmp, n);
    return true;
  };
  for (;;) {
    if (!in_body) {
      const auto end = buf.find("\r\n\r\n");
      if (end == std::string::npos) {
        if (!read_more()) throw std::runtime_error("connection closed before the response head");
        continue;
      }
      const std::string head = buf.substr(0, end);
      status = std::stoi(head.substr(9, 3));
      std::string lower = head;
      for (auto& ch : lower) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
      chunked = lower.find("transfer-encoding: chunked") != std::string::npos;
      buf.erase(0, end + 4);
      in_body = true;
    }
    if (!chunked) {
      if (!buf.empty() && !on_body(buf)) return status;
      buf.clear();
      if (!read_more()) return status;
      continue;
    }
    // Chunked: "<hex>\r\n<data>\r\n" … "0\r\n\r\n".
    const auto line_end = buf.find("\r\n");
    if (line_end != std::string::npos) {
      const std::size_t size = std::stoul(buf.substr(0, line_end), nullptr, 16);
      if (size == 0) return status;
      if (buf.size() >= line_end + 2 + size + 2) {
        const std::string data = buf.substr(line_end + 2, size);
        buf.erase(0, line_end + 2 + size + 2);
        if (!on_body(data)) return status;  // the socket closes on return
        continue;
      }
    }
    if (!read_more()) return status;
  }
}

}  // namespace servedeck::worker::testing
