// A small asynchronous HTTP/1.1 server on Boost.Beast, shared by the daemon (gateway, admin API)
// and the worker. Keep-alive, chunked streaming responses (SSE), a body size limit (413), a
// timeout on every read and write, a bound on connections, and client-disconnect notification
// so a streaming producer can cancel its upstream work at once.
//
// Threading: I/O runs on `threads` io_context threads. The Handler is called on an I/O thread
// and must return quickly: it either answers at once or keeps the Responder and answers later
// from any thread (Responder is thread-safe). Blocking work goes to post_blocking().
#pragma once

#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace servedeck::http {

using Headers = std::vector<std::pair<std::string, std::string>>;

struct Request {
  std::string method;                          // "GET", "POST", ...
  std::string target;                          // path + query as sent (an absolute-form target in origin form)
  std::string path;                            // target without the query string
  std::string query;                           // after '?', undecoded; empty when none
  std::map<std::string, std::string> headers;  // names lower-cased
  std::string body;
  std::string remote_address;                  // "127.0.0.1:53122"

  /// Header value or "" (name is matched case-insensitively).
  std::string header(std::string_view name) const;
};

/// The answer to one request. Exactly one of send() or start_stream()…end() is used.
/// Thread-safe: all methods may be called from any thread; writes are serialised in order.
class Responder {
 public:
  virtual ~Responder() = default;

  /// A complete response with Content-Length (for a HEAD request: the same head, no body).
  virtual void send(int status, std::string content_type, std::string body,
                    Headers extra_headers = {}) = 0;

  /// Starts a chunked response (text/event-stream by default; Cache-Control: no-cache).
  /// Returns false when the client is already gone, and for a HEAD request (the head alone is
  /// sent and the response is complete).
  virtual bool start_stream(int status, std::string content_type = "text/event-stream",
                            Headers extra_headers = {}) = 0;

  /// Queues bytes as one chunk, flushed as soon as the socket takes it (no coalescing delay).
  /// Returns false when the client is gone: the producer should stop and cancel its work.
  /// Bounded: when more than the server's max_pending_write_bytes are still queued as a chunk
  /// comes, the connection is considered stuck and closed (the call returns false); a chunk
  /// larger than the bound is queued whole when the queue is below it.
  virtual bool write(std::string_view bytes) = 0;

  /// Ends a stream (final zero chunk). Idempotent.
  virtual void end() = 0;

  /// True once the client disconnected (or a write failed / timed out).
  virtual bool client_gone() const = 0;

  /// `cb` runs once, on an I/O thread, when the client disconnects before end() (immediately if
  /// it already has; once the server has stopped, at once on the calling thread). Used to cancel
  /// upstream requests and generation.
  virtual void on_disconnect(std::function<void()> cb) = 0;

  /// Bytes queued for this connection and not yet taken by the socket (head, chunks, framing).
  /// A producer faster than its client uses this for backpressure.
  virtual std::size_t queued_bytes() const { return 0; }

  /// `cb` runs once, on an I/O thread, when queued_bytes() falls to `below` or less, or the
  /// connection closes (immediately if either already holds).
  virtual void when_drained(std::size_t below, std::function<void()> cb) {
    (void)below;
    cb();
  }

  /// What a responder that translates answers (a bridge to another API) sent instead of the
  /// status it was given to send(): the status and error code of its own refusal, e.g. 502 when
  /// an engine's 200 could not be translated. {0, ""} when it sent what it was given. The
  /// request log and metrics record this one, so a refused answer is never logged as a 200.
  struct Refusal {
    int status = 0;
    std::string error_code;
  };
  virtual Refusal refusal() const { return {}; }
};

using Handler = std::function<void(Request, std::shared_ptr<Responder>)>;

/// The answer to a request refused on its head alone (method, target, headers, peer).
struct HeadRejection {
  int status = 400;
  std::string body;                            // sent as application/json
  Headers extra_headers;                       // e.g. WWW-Authenticate
};

/// Runs on an I/O thread once a request's head has arrived, before its body is read and before
/// any `100 Continue`; `head.body` is empty. A rejection is sent at once and the connection is
/// closed (after a bounded lingering read that discards what the peer still sends), so a
/// refused client never gets its body read, buffered or parsed. Must not block; must not throw
/// (a throw is answered 500 and the connection closed).
using HeadCheck = std::function<std::optional<HeadRejection>(const Request& head)>;

/// Most bytes one connection's read buffer holds (bytes): a request head (64 KiB at most), a
/// chunk header or trailer line, and what a pipelining client sent ahead. A body passes through
/// in reads of 64 KiB, so max_body_bytes is not bounded by it. A chunk header or trailer that
/// has not ended within it is refused (400) instead of buffered.
inline constexpr std::size_t k_max_read_buffer_bytes = 1024 * 1024;

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 0;                                // 0 = ephemeral; see Server::port()
  int threads = 2;                             // I/O threads
  int blocking_threads = 4;                    // pool behind post_blocking()
  std::size_t max_body_bytes = 32 * 1024 * 1024;  // larger → 413 with the OpenAI envelope
  int header_timeout_ms = 30000;               // reading a request's headers and body
  int idle_timeout_ms = 120000;                // keep-alive idle
  int write_timeout_ms = 60000;                // one write stuck longer → connection closed
  std::size_t max_connections = 4096;          // above → 503 and close
  std::size_t max_pending_write_bytes = 8 * 1024 * 1024;
  HeadCheck head_check;                        // empty = every head is accepted
};

struct ServerError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class Server {
 public:
  Server(ServerOptions options, Handler handler);
  ~Server();  // stops
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  /// Binds, listens and starts the threads. Throws ServerError naming host:port and the
  /// system error when binding fails.
  void start();
  /// The bound port (after start()).
  int port() const;
  /// Closes the listener and every connection; joins the threads. Idempotent.
  void stop();
  /// Runs `fn` on the blocking pool (bounded queue; returns false when the queue is full).
  bool post_blocking(std::function<void()> fn);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// Sends `{"error":{...}}` (common/openai_error.hpp) with `status`.
void send_error(Responder& res, int status, std::string_view message, std::string_view type,
                std::string_view code, bool from_engine = false, Headers extra_headers = {});

}  // namespace servedeck::http
