// Session: one HTTP/1.1 connection of the server (common/http/server.hpp) on its strand —
// reading a request (header first, 100-continue, size limits), calling the Handler, the
// disconnect watch read, and the write queue that the Responder feeds. The class and the
// design notes are in server_internal.hpp.
#include "common/http/server_internal.hpp"

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <limits>

#include "common/http/wire_format.hpp"
#include "common/json_limits.hpp"
#include "common/openai_error.hpp"

namespace servedeck::http {

using detail::status_line;

Session::Session(tcp::socket socket, std::shared_ptr<ServerCore> srv)
    : core_(std::move(srv)), srv_(*core_), stream_(std::move(socket)), buffer_(k_max_read_buffer_bytes) {}

Session::~Session() {
  std::lock_guard lk(srv_.sessions_mu);
  srv_.sessions.erase(this);
  srv_.connections.fetch_sub(1);
}

void Session::start() {
  {
    std::lock_guard lk(srv_.sessions_mu);
    srv_.sessions.insert(this);
  }
  error_code ec;
  stream_.socket().set_option(tcp::no_delay(true), ec);
  auto ep = stream_.socket().remote_endpoint(ec);
  if (!ec) remote_ = ep.address().to_string() + ":" + std::to_string(ep.port());
  asio::dispatch(stream_.get_executor(), [self = shared_from_this()] {
    if (self->srv_.stopped) return self->close();
    self->read_header();
  });
}

void Session::reject_busy() {
  auto self = shared_from_this();
  auto body = dump_safe(make_error("too many connections", "overloaded_error", "too_many_connections"));
  auto bytes = std::make_shared<std::string>(status_line(503) + "Content-Type: application/json\r\nContent-Length: " +
                                             std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body);
  stream_.expires_after(std::chrono::milliseconds(srv_.opt.write_timeout_ms));
  asio::async_write(stream_, asio::buffer(*bytes), [self, bytes](error_code, std::size_t) { self->close(); });
}

void Session::queue(std::string bytes, bool last) {
  if (closed_) return;
  out_.push_back(std::move(bytes));
  if (last) response_complete_queued_ = true;
  flush();
}

void Session::abort_response() {
  if (writing_ || !out_.empty()) {
    abort_after_flush_ = true;
    return;
  }
  close();
}

void Session::add_disconnect_cb(std::function<void()> cb) {
  if (gone_fired_ || closed_) {
    cb();
    return;
  }
  disconnect_cbs_.push_back(std::move(cb));
}

void Session::add_drain_cb(std::size_t below, std::function<void()> cb) {
  if (closed_ || pending_bytes.load() <= below) return cb();
  drain_cbs_.emplace_back(below, std::move(cb));
}

void Session::read_header() {
  if (closed_) return;
  head_request = false;  // until this request's head says otherwise (errors before it carry a body)
  parser_.emplace();
  // note: no body limit while the head is read, or the parser itself would answer an oversized
  // Content-Length (413) before head_check saw the request; on_header sets the limit. (Not
  // boost::none: Boost 1.74 compares the length against the empty optional and always refuses.)
  parser_->body_limit(std::numeric_limits<std::uint64_t>::max());
  parser_->header_limit(64 * 1024);
  stream_.expires_after(std::chrono::milliseconds(first_request_ ? srv_.opt.header_timeout_ms
                                                                 : srv_.opt.idle_timeout_ms));
  bhttp::async_read_header(stream_, buffer_, *parser_,
                           [self = shared_from_this()](error_code ec, std::size_t) { self->on_header(ec); });
}

Request Session::make_head() const {
  const auto& msg = parser_->get();
  Request req;
  req.method = std::string(msg.method_string());
  req.target = detail::origin_form(msg.target());
  auto q = req.target.find('?');
  req.path = req.target.substr(0, q);
  if (q != std::string::npos) req.query = req.target.substr(q + 1);
  for (const auto& f : msg) {
    std::string name(f.name_string());
    std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::tolower(c); });
    auto [it, inserted] = req.headers.emplace(name, std::string(f.value()));
    if (!inserted) it->second += ", " + std::string(f.value());
  }
  req.remote_address = remote_;
  return req;
}

void Session::on_header(error_code ec) {
  if (ec) return on_read_error(ec);
  first_request_ = false;
  auto& req = parser_->get();
  head_request = req.method() == bhttp::verb::head;  // a refusal of a HEAD request sends no body
  head_ = make_head();
  if (srv_.opt.head_check) {
    std::optional<HeadRejection> refused;
    try {
      refused = srv_.opt.head_check(*head_);
    } catch (const std::exception& e) {
      refused = HeadRejection{500, dump_safe(make_error(std::string("internal error while checking the request head: ") +
                                                            e.what(), "server_error", "internal_error")), {}};
    } catch (...) {
      refused = HeadRejection{500, dump_safe(make_error("internal error while checking the request head", "server_error",
                                                        "internal_error")), {}};
    }
    if (refused) {
      head_.reset();
      parser_.reset();
      return send_simple_and_close(refused->status, std::move(refused->body), refused->extra_headers);
    }
  }
  // RFC 9112 6.1: chunked is the only transfer coding read here. A request whose last coding is
  // not chunked has no determinable length: 400 (RFC 9112 6.3). Codings before chunked (gzip,
  // chunked) would be read as if plain: 501 (RFC 9110 15.6.2). Both close the connection.
  if (req.find(bhttp::field::transfer_encoding) != req.end()) {
    auto trim = [](std::string_view v) {
      while (!v.empty() && (v.front() == ' ' || v.front() == '\t')) v.remove_prefix(1);
      while (!v.empty() && (v.back() == ' ' || v.back() == '\t')) v.remove_suffix(1);
      return v;
    };
    std::string codings;  // every Transfer-Encoding field, in order, as one list
    const auto [first_te, end_te] = req.equal_range(bhttp::field::transfer_encoding);
    for (auto f = first_te; f != end_te; ++f) codings += (codings.empty() ? "" : ", ") + std::string(trim(f->value()));
    const std::string_view all = trim(codings);
    const auto comma = all.rfind(',');
    const bool last_chunked = beast::iequals(trim(comma == std::string_view::npos ? all : all.substr(comma + 1)), "chunked");
    if (!beast::iequals(all, "chunked")) {
      const int status = last_chunked ? 501 : 400;
      std::string body = dump_safe(make_error(
          "Transfer-Encoding '" + std::string(all.substr(0, 64)) + "' " +
              (last_chunked ? "is not supported" : "does not end in chunked") +
              "; send the body with Content-Length or Transfer-Encoding: chunked",
          "invalid_request_error", "unsupported_transfer_encoding"));
      head_.reset();
      parser_.reset();
      return send_simple_and_close(status, std::move(body));
    }
  }
  if (auto len = parser_->content_length(); len && *len > srv_.opt.max_body_bytes) {
    return send_simple_and_close(413, body_too_large());
  }
  parser_->body_limit(srv_.opt.max_body_bytes);
  // RFC 9110 10.1.1: a 1.0 client's Expect is ignored (it would read the 100 as the answer).
  if (req.version() >= 11 && beast::iequals(req[bhttp::field::expect], "100-continue")) {
    auto cont = std::make_shared<std::string>("HTTP/1.1 100 Continue\r\n\r\n");
    stream_.expires_after(std::chrono::milliseconds(srv_.opt.write_timeout_ms));
    asio::async_write(stream_, asio::buffer(*cont), [self = shared_from_this(), cont](error_code wec, std::size_t) {
      if (wec) return self->close();
      self->read_body();
    });
    return;
  }
  read_body();
}

void Session::read_body() {
  stream_.expires_after(std::chrono::milliseconds(srv_.opt.header_timeout_ms));
  bhttp::async_read(stream_, buffer_, *parser_,
                    [self = shared_from_this()](error_code ec, std::size_t) { self->on_body(ec); });
}

std::string Session::body_too_large() const {
  return dump_safe(make_error("request body exceeds the limit of " + std::to_string(srv_.opt.max_body_bytes) + " bytes",
                              "invalid_request_error", "body_too_large"));
}

void Session::on_read_error(error_code ec) {
  if (ec == bhttp::error::body_limit) return send_simple_and_close(413, body_too_large());
  if (ec == bhttp::error::header_limit)
    return send_simple_and_close(431, dump_safe(make_error("request headers too large", "invalid_request_error",
                                                           "headers_too_large")));
  // note: Beast 1.74 reads a chunk header or trailer until its CRLF without a limit of its own.
  if (ec == bhttp::error::buffer_overflow)
    return send_simple_and_close(400, dump_safe(make_error("malformed HTTP request: a chunk header or trailer longer than " +
                                                               std::to_string(k_max_read_buffer_bytes) + " bytes",
                                                           "invalid_request_error", "bad_http")));
  if (ec == bhttp::error::end_of_stream || ec == asio::error::eof || ec == beast::error::timeout ||
      ec == asio::error::operation_aborted || ec == asio::error::connection_reset || buffer_.size() == 0)
    return close();
  send_simple_and_close(400, dump_safe(make_error("malformed HTTP request: " + ec.message(), "invalid_request_error",
                                                  "bad_http")));
}

void Session::on_body(error_code ec) {
  if (ec) return on_read_error(ec);
  auto msg = parser_->release();
  parser_.reset();
  Request req = head_ ? std::move(*head_) : Request{};
  head_.reset();
  head_request = msg.method() == bhttp::verb::head;
  req.body = std::move(msg.body());
  http10 = msg.version() < 11;
  keep_alive_ = msg.keep_alive() && !http10;
  response_complete_queued_ = false;
  response_done_ = false;
  pending_bytes = 0;
  start_watch();
  auto responder = make_responder();
  // note: a handler that throws (a bug, or outside input a handler failed to validate) must
  // not take the process down: the client gets a 500 envelope naming the exception. The
  // handler owns the responder as before (dropping it answers 500 no_response); the catch
  // reaches it only if the handler still holds it somewhere.
  std::weak_ptr<Responder> weak = responder;
  try {
    srv_.handler(std::move(req), std::move(responder));
  } catch (const std::exception& e) {
    if (auto r = weak.lock())
      send_error(*r, 500, std::string("internal error while handling the request: ") + e.what(), "server_error",
                 "internal_error");
  } catch (...) {
    if (auto r = weak.lock())
      send_error(*r, 500, "internal error while handling the request", "server_error", "internal_error");
  }
}

void Session::send_simple_and_close(int status, std::string body, const Headers& extra) {
  keep_alive_ = false;
  response_done_ = false;
  linger_ = true;
  std::string bytes = status_line(status) + "Content-Type: application/json\r\nContent-Length: " +
                      std::to_string(body.size()) + "\r\n";
  for (const auto& [k, v] : extra) bytes += k + ": " + v + "\r\n";
  bytes += "Connection: close\r\n\r\n";
  if (!head_request) bytes += body;  // HEAD: the same head, Content-Length included, no body
  pending_bytes += bytes.size();
  queue(std::move(bytes), true);
}

void Session::start_watch() {
  if (watching_ || closed_ || buffer_.size() > 64 * 1024) return;
  watching_ = true;
  stream_.expires_never();  // the producer owns the pace; writes get their own expiry
  stream_.async_read_some(buffer_.prepare(4096), [self = shared_from_this()](error_code ec, std::size_t n) {
    self->on_watch(ec, n);
  });
}

void Session::on_watch(error_code ec, std::size_t n) {
  watching_ = false;
  if (!ec) {
    buffer_.commit(n);
    if (response_done_) return read_header();
    return start_watch();
  }
  if (response_done_ && ec == asio::error::operation_aborted && !closed_) return read_header();
  if (!response_done_) mark_gone();
  close();
}

void Session::flush() {
  if (writing_ || out_.empty() || closed_) return;
  writing_ = true;
  writing_bufs_.clear();
  while (!out_.empty()) {
    writing_bufs_.push_back(std::move(out_.front()));
    out_.pop_front();
  }
  writing_is_last_ = response_complete_queued_;
  std::vector<asio::const_buffer> bufs;
  bufs.reserve(writing_bufs_.size());
  for (const auto& s : writing_bufs_) bufs.emplace_back(asio::buffer(s));
  // tcp_stream: with the watch read pending this sets only the write expiry.
  stream_.expires_after(std::chrono::milliseconds(srv_.opt.write_timeout_ms));
  asio::async_write(stream_, bufs, [self = shared_from_this()](error_code ec, std::size_t n) {
    self->on_write(ec, n);
  });
}

void Session::on_write(error_code ec, std::size_t n) {
  writing_ = false;
  pending_bytes.fetch_sub(std::min(n, pending_bytes.load()));
  fire_drained();
  if (ec) {
    mark_gone();
    return close();
  }
  if (!out_.empty()) return flush();
  if (abort_after_flush_) return close();
  if (writing_is_last_ && response_complete_queued_) {
    response_done_ = true;
    disconnect_cbs_.clear();  // the response ended: later closes are not "client gone"
    if (!keep_alive_) {
      error_code ignored;
      stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
      if (linger_) return linger();
      return close();
    }
    if (watching_) {
      error_code ignored;
      stream_.socket().cancel(ignored);  // on_watch then reads the next request
    } else {
      read_header();
    }
  }
}

void Session::linger() {
  if (closed_) return;
  // One deadline for the whole linger (set at its first read): a peer that trickles bytes
  // cannot extend it.
  if (linger_read_ == 0) stream_.expires_after(std::chrono::milliseconds(k_linger_ms));
  stream_.async_read_some(asio::buffer(linger_buf_), [self = shared_from_this()](error_code ec, std::size_t n) {
    self->linger_read_ += std::max<std::size_t>(n, 1);  // a zero-byte read still counts as started
    if (ec || self->linger_read_ >= k_linger_bytes) return self->close();
    self->linger();
  });
}

void Session::fire_drained() {
  if (drain_cbs_.empty()) return;
  std::vector<std::pair<std::size_t, std::function<void()>>> keep;
  std::vector<std::function<void()>> fire;
  for (auto& [below, cb] : drain_cbs_) {
    if (closed_ || pending_bytes.load() <= below)
      fire.push_back(std::move(cb));
    else
      keep.emplace_back(below, std::move(cb));
  }
  drain_cbs_ = std::move(keep);
  for (auto& cb : fire) cb();
}

void Session::mark_gone() {
  gone = true;
  if (gone_fired_) return;
  gone_fired_ = true;
  auto cbs = std::move(disconnect_cbs_);
  disconnect_cbs_.clear();
  for (auto& cb : cbs) cb();
}

void Session::close() {
  if (closed_) return;
  if (!response_done_) mark_gone();
  closed_ = true;
  gone = true;
  out_.clear();
  error_code ignored;
  // An HTTP/1.0 body ends where the connection closes, so a response cut short (the producer
  // gone, a client that stopped reading) is reset instead: the client sees an error, not an end.
  if (!response_done_ && http10) stream_.socket().set_option(asio::socket_base::linger(true, 0), ignored);
  stream_.socket().close(ignored);
  fire_drained();
}

}  // namespace servedeck::http
