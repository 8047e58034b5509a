// ResponderImpl: the thread-safe http::Responder handed to a Handler. It formats the status
// line, headers and chunks under its own mutex and posts them to the Session's strand
// (server_internal.hpp); it also defines Session::make_responder.
#include "common/http/server_internal.hpp"

#include "common/http/wire_format.hpp"
#include "common/json_limits.hpp"
#include "common/openai_error.hpp"

namespace servedeck::http {

using detail::has_header;
using detail::status_line;
using detail::to_hex;

namespace {

class ResponderImpl final : public Responder {
 public:
  explicit ResponderImpl(std::shared_ptr<Session> s) : session_(std::move(s)) {}

  ~ResponderImpl() override {
    std::lock_guard lk(mu_);
    if (!started_) {
      auto body = dump_safe(make_error("the handler produced no response", "server_error", "no_response"));
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
    chunked_ = !session_->http10;  // HTTP/1.0: the body ends where the connection closes
    head += "Content-Type: " + content_type + (chunked_ ? "\r\nTransfer-Encoding: chunked\r\n" : "\r\nConnection: close\r\n");
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
    std::string chunk;
    if (chunked_) {
      chunk = to_hex(bytes.size());
      chunk += "\r\n";
      chunk.append(bytes);
      chunk += "\r\n";
    } else {
      chunk.assign(bytes);
    }
    // Stuck is a client that left more than the bound unread when the next chunk comes; one
    // chunk larger than the bound (a whole tool call in one event) is queued whole, so the
    // queue holds at most the bound plus one chunk. Counting the chunk itself closed a client
    // that read everything, at the first event over 8 MiB.
    auto queued_before = session_->pending_bytes.fetch_add(chunk.size());
    if (queued_before > session_->server().opt.max_pending_write_bytes) {
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
    post_locked(chunked_ ? "0\r\n\r\n" : "", true);
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
  bool chunked_ = true;  // the stream's body in chunks (HTTP/1.1) or close-delimited (HTTP/1.0)
};

}  // namespace

std::shared_ptr<Responder> Session::make_responder() {
  return std::make_shared<ResponderImpl>(shared_from_this());
}

}  // namespace servedeck::http
