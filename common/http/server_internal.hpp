// Internal to the HTTP server (common/http/server.hpp): the state its three translation units
// share. server.cpp holds Server (listen, accept, stop, post_blocking) and send_error;
// server_session.cpp holds Session (one connection: reads, the disconnect watch, the write
// queue); server_responder.cpp holds ResponderImpl (the thread-safe Responder that feeds a
// Session from any thread). Not part of the public API; include it from nowhere else.
//
// One Session per TCP connection, all of its work on one strand. The session reads a request
// (header first, so `Expect: 100-continue` and an oversized Content-Length are answered before
// the body arrives), hands it to the Handler with a Responder, and while the response is being
// produced keeps one small "watch" read pending on the socket: when the peer closes, that read
// fails and the disconnect callbacks run at once (a streaming producer then cancels its
// upstream). Bytes the watch read receives (a pipelined next request) stay in the read buffer.
//
// A head_check (ServerOptions) sees the request head before the body is read; a refusal is
// answered at once with `Connection: close`. Every such answer (and 413/431/400) is followed by
// a lingering close: half-close, then read and discard what the peer still sends for at most
// k_linger_ms / k_linger_bytes, then close. Closing with unread bytes in the socket would make
// the kernel send RST, and the client could lose the answer it has not read yet.
//
// Responses are written as raw HTTP/1.1 bytes (status line, headers, body or chunks) from a
// queue; every queued piece is flushed as soon as the socket takes it, gathered into one write
// when several are waiting. TCP_NODELAY is set on every connection so a small SSE event is not
// held back by Nagle's algorithm.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_set>
#include <utility>
#include <vector>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include "common/http/blocking_pool.hpp"
#include "common/http/server.hpp"

namespace servedeck::http {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using tcp = asio::ip::tcp;
using boost::system::error_code;

class Session;

constexpr int k_linger_ms = 2000;                       // lingering close: longest wait
// note: nginx waits 500 ms after an accept() that failed for lack of descriptors; 100 ms frees
// the I/O thread as well and picks the backlog up sooner once a connection closes.
constexpr int k_accept_retry_ms = 100;                  // after a failed accept (EMFILE, ENFILE, ENOMEM)
constexpr std::size_t k_linger_bytes = 1024 * 1024;     // lingering close: most bytes discarded

struct ServerCore {
  ServerOptions opt;
  Handler handler;
  asio::io_context ioc;
  std::optional<tcp::acceptor> acceptor;
  std::optional<asio::steady_timer> accept_retry;  // the wait after a failed accept (do_accept)
  bool accept_failing = false;                     // the last accept failed; touched by the accept chain only
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

/// One connection. Lives as long as a read/write or a Responder refers to it.
class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket socket, std::shared_ptr<ServerCore> srv);

  ~Session();

  void start();

  /// Server stop: closes the connection (on the strand).
  void close_now() { close(); }

  /// Rejects at once with 503 (over max_connections).
  void reject_busy();

  // --- called by the Responder; every method runs on the strand ---------------------------
  void queue(std::string bytes, bool last);
  /// The responder was dropped mid-stream (or its queue overflowed): what was queued is still
  /// flushed, then the connection closes without the final chunk, so the client sees a
  /// truncated body rather than a clean end.
  void abort_response();
  void add_disconnect_cb(std::function<void()> cb);
  void add_drain_cb(std::size_t below, std::function<void()> cb);
  auto executor() { return stream_.get_executor(); }
  std::atomic<bool> gone{false};
  std::atomic<std::size_t> pending_bytes{0};
  /// The request being answered is HEAD: its response carries the head only (RFC 9110 9.3.2).
  std::atomic<bool> head_request{false};
  /// The request being answered is HTTP/1.0: no chunked coding (RFC 9112 7: 1.1 only), so a
  /// stream's body is delimited by closing the connection, which every 1.0 response then does.
  std::atomic<bool> http10{false};
  ServerCore& server() { return srv_; }

 private:
  void read_header();
  void on_header(error_code ec);
  /// The head as a Request (no body yet): method, target, path, query, headers, peer.
  Request make_head() const;
  void read_body();
  std::string body_too_large() const;
  void on_read_error(error_code ec);
  void on_body(error_code ec);

  std::shared_ptr<Responder> make_responder();  // in server_responder.cpp

  void send_simple_and_close(int status, std::string body, const Headers& extra = {});
  /// The lingering close (see above); ends in close().
  void linger();
  // The watch read: detects a peer that closes while its response is being produced.
  void start_watch();
  void on_watch(error_code ec, std::size_t n);
  void flush();
  void on_write(error_code ec, std::size_t n);
  void fire_drained();
  void mark_gone();
  void close();

  std::shared_ptr<ServerCore> core_;  // first member: destroyed last
  ServerCore& srv_;
  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;
  std::optional<bhttp::request_parser<bhttp::string_body>> parser_;
  std::optional<Request> head_;  // the request being read, from on_header until on_body
  std::array<char, 4096> linger_buf_{};
  std::size_t linger_read_ = 0;
  bool linger_ = false;          // the answer being written is followed by a lingering close
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

}  // namespace servedeck::http
