// Implementation of common/http/client.hpp: a private io_context per call, async Beast
// operations with a deadline each, run to completion on the calling thread.
#include "common/http/client.hpp"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <optional>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

namespace servedeck::http {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using tcp = asio::ip::tcp;
using boost::system::error_code;

namespace {

constexpr std::uint64_t k_max_response_bytes = 1ull << 31;  // 2 GiB: bounds a runaway fetch()

std::string lower(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(), [](unsigned char c) { return std::tolower(c); });
  return out;
}

/// One connection with a per-operation deadline, driven synchronously.
class Conn {
 public:
  explicit Conn(const ClientRequest& req) : req_(req), stream_(ioc_) {}

  [[noreturn]] void fail(std::string_view what, const error_code& ec) const {
    throw ClientError(req_.method + " http://" + req_.host + ":" + std::to_string(req_.port) + req_.target +
                      ": " + std::string(what) + ": " + ec.message());
  }

  void connect(int timeout_ms) {
    error_code ec;
    tcp::resolver resolver(ioc_);
    tcp::resolver::results_type results;
    std::optional<error_code> result;
    stream_.expires_after(std::chrono::milliseconds(timeout_ms));
    resolver.async_resolve(req_.host, std::to_string(req_.port),
                           [&](error_code e, tcp::resolver::results_type r) {
                             result = e;
                             results = std::move(r);
                           });
    run();
    if (*result) fail("resolve", *result);
    result.reset();
    stream_.async_connect(results, [&](error_code e, const tcp::endpoint&) { result = e; });
    run();
    if (*result) fail("connect", *result);
    stream_.socket().set_option(tcp::no_delay(true), ec);
  }

  void write(int timeout_ms) {
    bhttp::request<bhttp::string_body> msg{bhttp::string_to_verb(req_.method), req_.target, 11};
    if (msg.method() == bhttp::verb::unknown) msg.method_string(req_.method);
    const bool ipv6 = req_.host.find(':') != std::string::npos;  // a literal: bracketed in Host (RFC 3986)
    msg.set(bhttp::field::host, (ipv6 ? "[" + req_.host + "]" : req_.host) + ":" + std::to_string(req_.port));
    msg.set(bhttp::field::connection, "close");
    if (!req_.body.empty() || req_.method == "POST" || req_.method == "PUT") {
      msg.set(bhttp::field::content_type, req_.content_type);
      msg.body() = req_.body;
      msg.prepare_payload();
    }
    for (const auto& [k, v] : req_.headers) msg.set(k, v);
    std::optional<error_code> result;
    stream_.expires_after(std::chrono::milliseconds(timeout_ms));
    bhttp::async_write(stream_, msg, [&](error_code e, std::size_t) { result = e; });
    run();
    if (*result) fail("write", *result);
  }

  template <class Parser>
  error_code read_header(Parser& p, int timeout_ms) {
    std::optional<error_code> result;
    stream_.expires_after(std::chrono::milliseconds(timeout_ms));
    bhttp::async_read_header(stream_, buffer_, p, [&](error_code e, std::size_t) { result = e; });
    run();
    return *result;
  }

  template <class Parser>
  error_code read_some(Parser& p, int timeout_ms) {
    std::optional<error_code> result;
    stream_.expires_after(std::chrono::milliseconds(timeout_ms));
    bhttp::async_read_some(stream_, buffer_, p, [&](error_code e, std::size_t) { result = e; });
    run();
    return *result;
  }

  template <class Parser>
  error_code read_all(Parser& p, int timeout_ms) {
    std::optional<error_code> result;
    stream_.expires_after(std::chrono::milliseconds(timeout_ms));
    bhttp::async_read(stream_, buffer_, p, [&](error_code e, std::size_t) { result = e; });
    run();
    return *result;
  }

  void close() {
    error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
    stream_.socket().close(ignored);
  }

 private:
  void run() {
    ioc_.restart();
    ioc_.run();
  }
  const ClientRequest& req_;
  asio::io_context ioc_;
  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;
};

template <class Fields>
std::map<std::string, std::string> header_map(const Fields& fields) {
  std::map<std::string, std::string> out;
  for (const auto& f : fields) {
    auto [it, inserted] = out.emplace(lower(f.name_string()), std::string(f.value()));
    if (!inserted) it->second += ", " + std::string(f.value());
  }
  return out;
}

}  // namespace

ClientResponse fetch(const ClientRequest& req) {
  using clock = std::chrono::steady_clock;
  auto deadline = clock::now() + std::chrono::milliseconds(req.timeout_ms);
  auto left = [&] {
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock::now()).count();
    return static_cast<int>(std::max<long long>(1, ms));
  };
  Conn c(req);
  c.connect(left());
  c.write(left());
  bhttp::response_parser<bhttp::string_body> p;
  p.body_limit(k_max_response_bytes);
  if (req.method == "HEAD") p.skip(true);  // a HEAD response has a Content-Length but no body
  if (auto ec = c.read_all(p, left())) c.fail("read response", ec);
  ClientResponse out;
  out.status = static_cast<int>(p.get().result_int());
  out.headers = header_map(p.get());
  out.body = std::move(p.get().body());
  c.close();
  return out;
}

void fetch_stream(const ClientRequest& req,
                  const std::function<void(int status, const std::map<std::string, std::string>& headers)>& on_head,
                  const std::function<bool(std::string_view chunk)>& on_chunk) {
  Conn c(req);
  c.connect(req.timeout_ms);
  c.write(req.timeout_ms);
  bhttp::response_parser<bhttp::buffer_body> p;
  p.body_limit(std::uint64_t{1} << 62);  // note: boost::none trips a Beast 1.74 bug (len > none is true)
  if (auto ec = c.read_header(p, req.timeout_ms)) c.fail("read response head", ec);
  if (on_head) on_head(static_cast<int>(p.get().result_int()), header_map(p.get()));
  char buf[16384];
  while (!p.is_done()) {
    p.get().body().data = buf;
    p.get().body().size = sizeof(buf);
    auto ec = c.read_some(p, req.timeout_ms);
    if (ec == bhttp::error::need_buffer) ec = {};
    if (ec) c.fail("read response body", ec);
    std::size_t n = sizeof(buf) - p.get().body().size;
    if (n > 0 && !on_chunk(std::string_view(buf, n))) {
      c.close();
      return;
    }
  }
  c.close();
}

}  // namespace servedeck::http
