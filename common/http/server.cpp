// Implementation of common/http/server.hpp.
//
// One Session per TCP connection, all of its work on one strand. The session reads a request
// (header first, so `Expect: 100-continue` and an oversized Content-Length are answered before
// the body arrives), hands it to the Handler with a Responder, and while the response is being
// produced keeps one small "watch" read pending on the socket: when the peer closes, that read
// fails and the disconnect callbacks run at once (a streaming producer then cancels its
// upstream). Bytes the watch read receives (a pipelined next request) stay in the read buffer.
//
// Responses are written as raw HTTP/1.1 bytes (status line, headers, body or chunks) from a
// queue; every queued piece is flushed as soon as the socket takes it, gathered into one write
// when several are waiting. TCP_NODELAY is set on every connection so a small SSE event is not
// held back by Nagle's algorithm.
#include "common/http/server.hpp"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <deque>
#include <mutex>
#include <thread>
#include <unordered_set>
#include <vector>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include "common/http/blocking_pool.hpp"
#include "common/http/wire_format.hpp"
#include "common/openai_error.hpp"

namespace servedeck::http {

using detail::has_header;
using detail::status_line;
using detail::to_hex;

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using tcp = asio::ip::tcp;
using boost::system::error_code;

std::string Request::header(std::string_view name) const {
  std::string key(name);
  std::transform(key.begin(), key.end(), key.begin(), [](unsigned char c) { return std::tolower(c); });
  auto it = headers.find(key);
  return it == headers.end() ? std::string() : it->second;
}

class Session;

struct ServerCore {
  ServerOptions opt;
  Handler handler;
  asio::io_context ioc;
  std::optional<tcp::acceptor> acceptor;
  std::vector<std::thread> threads;
  std::unique_ptr<detail::BlockingPool> pool;
  std::atomic<std::size_t> connections{0};
  std::mutex sessions_mu;
  std::unordered_set<Session*> sessions;  // live sessions, for stop()
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> work;
  int port = 0;
  bool started = false;
  std::atomic<bool> stopped{false};
  std::atomic<int> posting{0};

  void do_accept(const std::shared_ptr<ServerCore>& self);

  /// Posts `fn` to `ex` unless the server stopped; returns whether it was queued. After stop()
  /// no handler is queued that could never run (it would keep its session, and so this core,
  /// alive forever).
  template <class Ex, class Fn>
  bool post(const Ex& ex, Fn&& fn) {
    posting.fetch_add(1);
    bool queued = !stopped.load();
    if (queued) asio::post(ex, std::forward<Fn>(fn));
    posting.fetch_sub(1);
    return queued;
  }
  template <class Ex, class Fn>
  bool dispatch(const Ex& ex, Fn&& fn) {
    posting.fetch_add(1);
    bool queued = !stopped.load();
    if (queued) asio::dispatch(ex, std::forward<Fn>(fn));
    posting.fetch_sub(1);
    return queued;
  }
};

// note: the core is shared with every Session, so a Responder kept by a producer thread past
// the Server's lifetime still refers to live memory (its writes are then dropped).
struct Server::Impl {
  std::shared_ptr<ServerCore> core = std::make_shared<ServerCore>();
};

/// One connection. Lives as long as a read/write or a Responder refers to it.
class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket socket, std::shared_ptr<ServerCore> srv)
      : core_(std::move(srv)), srv_(*core_), stream_(std::move(socket)) {}

  ~Session() {
    std::lock_guard lk(srv_.sessions_mu);
    srv_.sessions.erase(this);
    srv_.connections.fetch_sub(1);
  }

  void start() {
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

  /// Server stop: closes the connection (on the strand).
  void close_now() { close(); }

  /// Rejects at once with 503 (over max_connections).
  void reject_busy() {
    auto self = shared_from_this();
    auto body = make_error("too many connections", "overloaded_error", "too_many_connections").dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    auto bytes = std::make_shared<std::string>(status_line(503) + "Content-Type: application/json\r\nContent-Length: " +
                                               std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body);
    stream_.expires_after(std::chrono::milliseconds(srv_.opt.write_timeout_ms));
    asio::async_write(stream_, asio::buffer(*bytes), [self, bytes](error_code, std::size_t) { self->close(); });
  }

  // --- called by the Responder; every method runs on the strand ---------------------------
  void queue(std::string bytes, bool last) {
    if (closed_) return;
    out_.push_back(std::move(bytes));
    if (last) response_complete_queued_ = true;
    flush();
  }
  /// The responder was dropped mid-stream (or its queue overflowed): what was queued is still
  /// flushed, then the connection closes without the final chunk, so the client sees a
  /// truncated body rather than a clean end.
  void abort_response() {
    if (writing_ || !out_.empty()) {
      abort_after_flush_ = true;
      return;
    }
    close();
  }
  void add_disconnect_cb(std::function<void()> cb) {
    if (gone_fired_ || closed_) {
      cb();
      return;
    }
    disconnect_cbs_.push_back(std::move(cb));
  }
  void add_drain_cb(std::size_t below, std::function<void()> cb) {
    if (closed_ || pending_bytes.load() <= below) return cb();
    drain_cbs_.emplace_back(below, std::move(cb));
  }
  auto executor() { return stream_.get_executor(); }
  std::atomic<bool> gone{false};
  std::atomic<std::size_t> pending_bytes{0};
  /// The request being answered is HEAD: its response carries the head only (RFC 9110 9.3.2).
  std::atomic<bool> head_request{false};
  ServerCore& server() { return srv_; }

 private:
  void read_header() {
    if (closed_) return;
    parser_.emplace();
    parser_->body_limit(srv_.opt.max_body_bytes);
    parser_->header_limit(64 * 1024);
    stream_.expires_after(std::chrono::milliseconds(first_request_ ? srv_.opt.header_timeout_ms
                                                                   : srv_.opt.idle_timeout_ms));
    bhttp::async_read_header(stream_, buffer_, *parser_,
                             [self = shared_from_this()](error_code ec, std::size_t) { self->on_header(ec); });
  }

  void on_header(error_code ec) {
    if (ec) return on_read_error(ec);
    first_request_ = false;
    auto& req = parser_->get();
    if (auto len = parser_->content_length(); len && *len > srv_.opt.max_body_bytes) {
      return send_simple_and_close(413, body_too_large());
    }
    if (beast::iequals(req[bhttp::field::expect], "100-continue")) {
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

  void read_body() {
    stream_.expires_after(std::chrono::milliseconds(srv_.opt.header_timeout_ms));
    bhttp::async_read(stream_, buffer_, *parser_,
                      [self = shared_from_this()](error_code ec, std::size_t) { self->on_body(ec); });
  }

  std::string body_too_large() const {
    return make_error("request body exceeds the limit of " + std::to_string(srv_.opt.max_body_bytes) + " bytes",
                      "invalid_request_error", "body_too_large")
        .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  }

  void on_read_error(error_code ec) {
    if (ec == bhttp::error::body_limit) return send_simple_and_close(413, body_too_large());
    if (ec == bhttp::error::header_limit)
      return send_simple_and_close(431, make_error("request headers too large", "invalid_request_error",
                                                   "headers_too_large").dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
    if (ec == bhttp::error::end_of_stream || ec == asio::error::eof || ec == beast::error::timeout ||
        ec == asio::error::operation_aborted || ec == asio::error::connection_reset || buffer_.size() == 0)
      return close();
    send_simple_and_close(400, make_error("malformed HTTP request: " + ec.message(), "invalid_request_error",
                                          "bad_http").dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
  }

  void on_body(error_code ec) {
    if (ec) return on_read_error(ec);
    auto msg = parser_->release();
    parser_.reset();
    Request req;
    req.method = std::string(msg.method_string());
    head_request = msg.method() == bhttp::verb::head;
    req.target = std::string(msg.target());
    auto q = req.target.find('?');
    req.path = req.target.substr(0, q);
    if (q != std::string::npos) req.query = req.target.substr(q + 1);
    for (const auto& f : msg) {
      std::string name(f.name_string());
      std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::tolower(c); });
      auto [it, inserted] = req.headers.emplace(name, std::string(f.value()));
      if (!inserted) it->second += ", " + std::string(f.value());
    }
    req.body = std::move(msg.body());
    req.remote_address = remote_;
    keep_alive_ = msg.keep_alive();
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

  std::shared_ptr<Responder> make_responder();

  void send_simple_and_close(int status, std::string body) {
    keep_alive_ = false;
    response_done_ = false;
    std::string bytes = status_line(status) + "Content-Type: application/json\r\nContent-Length: " +
                        std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body;
    pending_bytes += bytes.size();
    queue(std::move(bytes), true);
  }
  // The watch read: detects a peer that closes while its response is being produced.
  void start_watch() {
    if (watching_ || closed_ || buffer_.size() > 64 * 1024) return;
    watching_ = true;
    stream_.expires_never();  // the producer owns the pace; writes get their own expiry
    stream_.async_read_some(buffer_.prepare(4096), [self = shared_from_this()](error_code ec, std::size_t n) {
      self->on_watch(ec, n);
    });
  }

  void on_watch(error_code ec, std::size_t n) {
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

  void flush() {
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

  void on_write(error_code ec, std::size_t n) {
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

  void fire_drained() {
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

  void mark_gone() {
    gone = true;
    if (gone_fired_) return;
    gone_fired_ = true;
    auto cbs = std::move(disconnect_cbs_);
    disconnect_cbs_.clear();
    for (auto& cb : cbs) cb();
  }

  void close() {
    if (closed_) return;
    if (!response_done_) mark_gone();
    closed_ = true;
    gone = true;
    out_.clear();
    error_code ignored;
    stream_.socket().close(ignored);
    fire_drained();
  }

  std::shared_ptr<ServerCore> core_;  // first member: destroyed last
  ServerCore& srv_;
  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;
  std::optional<bhttp::request_parser<bhttp::string_body>> parser_;
  std::string remote_;
  std::deque<std::string> out_;
  std::vector<std::string> writing_bufs_;
  std::vector<std::function<void()>> disconnect_cbs_;
  std::vector<std::pair<std::size_t, std::function<void()>>> drain_cbs_;
  bool writing_ = false;
  bool writing_is_last_ = false;
  bool abort_after_flush_ = false;
  bool watching_ = false;
  bool keep_alive_ = true;
  bool response_complete_queued_ = false;
  bool response_done_ = true;
  bool gone_fired_ = false;
  bool closed_ = false;
  bool first_request_ = true;
};

namespace {

class ResponderImpl final : public Responder {
 public:
  explicit ResponderImpl(std::shared_ptr<Session> s) : session_(std::move(s)) {}

  ~ResponderImpl() override {
    std::lock_guard lk(mu_);
    if (!started_) {
      auto body = make_error("the handler produced no response", "server_error", "no_response").dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
      post_locked(status_line(500) + "Content-Type: application/json\r\nContent-Length: " +
                      std::to_string(body.size()) + "\r\n\r\n" + (session_->head_request ? std::string() : body),
                  true);
    } else if (streaming_ && !ended_) {
      session_->server().post(session_->executor(), [s = session_] { s->abort_response(); });
    }
  }

  void send(int status, std::string content_type, std::string body, Headers extra) override {
    std::lock_guard lk(mu_);
    if (started_) return;
    started_ = true;
    ended_ = true;
    std::string head = status_line(status);
    head += "Content-Type: " + content_type + "\r\nContent-Length: " + std::to_string(body.size()) + "\r\n";
    for (const auto& [k, v] : extra) head += k + ": " + v + "\r\n";
    head += "\r\n";
    if (!session_->head_request) head += body;  // HEAD: the same head, Content-Length included, no body
    post_locked(std::move(head), true);
  }

  bool start_stream(int status, std::string content_type, Headers extra) override {
    std::lock_guard lk(mu_);
    if (started_) return !session_->gone;
    started_ = true;
    streaming_ = true;
    std::string head = status_line(status);
    head += "Content-Type: " + content_type + "\r\nTransfer-Encoding: chunked\r\n";
    if (!has_header(extra, "cache-control")) head += "Cache-Control: no-cache\r\n";
    for (const auto& [k, v] : extra) head += k + ": " + v + "\r\n";
    head += "\r\n";
    if (session_->head_request) {
      // HEAD: the head is the whole response (no chunks); later write() calls report false.
      ended_ = true;
      post_locked(std::move(head), true);
      return false;
    }
    post_locked(std::move(head), false);
    return !session_->gone;
  }

  bool write(std::string_view bytes) override {
    std::lock_guard lk(mu_);
    if (!streaming_ || ended_ || session_->gone) return false;
    if (bytes.empty()) return true;  // an empty chunk would end the stream
    std::string chunk = to_hex(bytes.size());
    chunk += "\r\n";
    chunk.append(bytes);
    chunk += "\r\n";
    auto pending = session_->pending_bytes.fetch_add(chunk.size()) + chunk.size();
    if (pending > session_->server().opt.max_pending_write_bytes) {
      session_->gone = true;
      session_->server().post(session_->executor(), [s = session_] { s->close_now(); });
      return false;
    }
    post_locked(std::move(chunk), false, true);
    return true;
  }

  void end() override {
    std::lock_guard lk(mu_);
    if (!streaming_ || ended_) return;
    ended_ = true;
    post_locked("0\r\n\r\n", true);
  }

  bool client_gone() const override { return session_->gone; }

  std::size_t queued_bytes() const override { return session_->pending_bytes.load(); }

  void when_drained(std::size_t below, std::function<void()> cb) override {
    auto shared_cb = std::make_shared<std::function<void()>>(std::move(cb));
    bool queued = session_->server().dispatch(
        session_->executor(), [s = session_, below, shared_cb] { s->add_drain_cb(below, std::move(*shared_cb)); });
    // Stopped server: the connection is closed, which counts as drained (as on_disconnect below).
    if (!queued) (*shared_cb)();
  }

  void on_disconnect(std::function<void()> cb) override {
    auto shared_cb = std::make_shared<std::function<void()>>(std::move(cb));
    bool queued = session_->server().dispatch(
        session_->executor(), [s = session_, shared_cb] { s->add_disconnect_cb(std::move(*shared_cb)); });
    // The server stopped, so this connection is closed (or being closed by stop()): the client is
    // gone and the callback runs now, on this thread. Dropping it left a producer that registered
    // while stop() ran (a handler in flight) never cancelled.
    if (!queued) (*shared_cb)();
  }

 private:
  void post_locked(std::string bytes, bool last, bool counted = false) {
    if (!counted) session_->pending_bytes += bytes.size();
    session_->server().post(session_->executor(),
                            [s = session_, b = std::move(bytes), last]() mutable { s->queue(std::move(b), last); });
  }
  std::shared_ptr<Session> session_;
  std::mutex mu_;
  bool started_ = false;
  bool streaming_ = false;
  bool ended_ = false;
};

}  // namespace

std::shared_ptr<Responder> Session::make_responder() {
  return std::make_shared<ResponderImpl>(shared_from_this());
}

void ServerCore::do_accept(const std::shared_ptr<ServerCore>& self) {
  acceptor->async_accept(asio::make_strand(ioc), [this, self](error_code ec, tcp::socket socket) {
    if (ec == asio::error::operation_aborted || !acceptor->is_open()) return;
    if (!ec) {
      auto n = connections.fetch_add(1) + 1;
      auto s = std::make_shared<Session>(std::move(socket), self);
      if (n > opt.max_connections) {
        asio::dispatch(s->executor(), [s] { s->reject_busy(); });
      } else {
        s->start();
      }
    }
    do_accept(self);
  });
}

Server::Server(ServerOptions options, Handler handler) : impl_(std::make_unique<Impl>()) {
  impl_->core->opt = std::move(options);
  impl_->core->handler = std::move(handler);
}

Server::~Server() { stop(); }

void Server::start() {
  auto& im = *impl_->core;
  if (im.started) return;
  error_code ec;
  auto addr = asio::ip::make_address(im.opt.host, ec);
  if (ec) throw ServerError("cannot listen on " + im.opt.host + ":" + std::to_string(im.opt.port) +
                            ": not an IP address (" + ec.message() + ")");
  tcp::endpoint ep(addr, static_cast<unsigned short>(im.opt.port));
  im.acceptor.emplace(im.ioc);
  auto check = [&](const char* what) {
    if (ec) throw ServerError("cannot listen on " + im.opt.host + ":" + std::to_string(im.opt.port) + ": " + what +
                              ": " + ec.message());
  };
  im.acceptor->open(ep.protocol(), ec);
  check("open");
  im.acceptor->set_option(asio::socket_base::reuse_address(true), ec);
  check("SO_REUSEADDR");
  im.acceptor->bind(ep, ec);
  check("bind");
  im.acceptor->listen(asio::socket_base::max_listen_connections, ec);
  check("listen");
  im.port = im.acceptor->local_endpoint().port();
  im.pool = std::make_unique<detail::BlockingPool>(im.opt.blocking_threads, 1024);
  im.work.emplace(im.ioc.get_executor());
  im.do_accept(impl_->core);
  for (int i = 0; i < std::max(1, im.opt.threads); ++i) im.threads.emplace_back([&im] { im.ioc.run(); });
  im.started = true;
}

int Server::port() const { return impl_->core->port; }

void Server::stop() {
  auto& im = *impl_->core;
  if (!im.started || im.stopped.exchange(true)) return;
  // No Responder posts from here on; wait for posts already in progress.
  while (im.posting.load() != 0) std::this_thread::yield();
  asio::post(im.ioc, [&im] {
    error_code ignored;
    if (im.acceptor) im.acceptor->close(ignored);
  });
  // Pin the live sessions under the lock, close them outside it: a pinned session may lose its
  // other references meanwhile, and its destructor takes sessions_mu (dropping the last
  // reference while holding the lock deadlocked Server::stop).
  std::vector<std::shared_ptr<Session>> live;
  {
    std::lock_guard lk(im.sessions_mu);
    live.reserve(im.sessions.size());
    for (auto* s : im.sessions) {
      // The session may be in its destructor on another thread; weak_from_this is null then.
      if (auto sp = s->weak_from_this().lock()) live.push_back(std::move(sp));
    }
  }
  for (auto& sp : live) asio::post(sp->executor(), [sp] { sp->close_now(); });
  live.clear();
  im.work.reset();
  // With the listener and every socket closed, every pending operation completes (aborted)
  // and run() returns on its own.
  for (auto& t : im.threads)
    if (t.joinable()) t.join();
  im.threads.clear();
  // Handlers made ready by the last completions (none should remain; this breaks any cycle
  // session → core → io_context → handler → session).
  im.ioc.restart();
  im.ioc.poll();
  if (im.pool) im.pool->stop();
}

bool Server::post_blocking(std::function<void()> fn) {
  auto& im = *impl_->core;
  if (!im.pool) return false;
  return im.pool->post(std::move(fn));
}

void send_error(Responder& res, int status, std::string_view message, std::string_view type,
                std::string_view code, bool from_engine, Headers extra_headers) {
  res.send(status, "application/json",
           make_error(message, type, code, from_engine ? ErrorSource::engine : ErrorSource::servedeck)
               .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace),
           std::move(extra_headers));
}

}  // namespace servedeck::http
