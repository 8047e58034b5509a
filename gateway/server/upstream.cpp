#include "gateway/server/upstream.hpp"

#include <utility>  // before Boost.Asio: boost 1.74 awaitable.hpp needs std::exchange

#include <algorithm>
#include <cctype>
#include <chrono>
#include <optional>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

namespace servedeck::gateway {

namespace asio = boost::asio;
namespace bhttp = boost::beast::http;
using tcp = asio::ip::tcp;
using boost::system::error_code;

std::string_view to_string(UpstreamFailure f) {
  switch (f) {
    case UpstreamFailure::none: return "none";
    case UpstreamFailure::connect: return "connect";
    case UpstreamFailure::connect_timeout: return "connect_timeout";
    case UpstreamFailure::first_byte_timeout: return "first_byte_timeout";
    case UpstreamFailure::gap_timeout: return "gap_timeout";
    case UpstreamFailure::request_timeout: return "request_timeout";
    case UpstreamFailure::closed: return "closed";
    case UpstreamFailure::io: return "io";
    case UpstreamFailure::cancelled: return "cancelled";
  }
  return "io";
}

namespace {

/// The most interim 1xx responses (100 Continue, 103 Early Hints) skipped before the final one;
/// an engine sends one at most.
constexpr int k_max_interim_responses = 8;

class Call final : public UpstreamCall, public std::enable_shared_from_this<Call> {
 public:
  Call(asio::any_io_executor ex, UpstreamRequest req, UpstreamCallbacks cb)
      : ex_(std::move(ex)),
        req_(std::move(req)),
        cb_(std::move(cb)),
        socket_(ex_),
        timer_(ex_),
        total_timer_(ex_),
        resolver_(ex_) {}

  void start() {
    asio::dispatch(ex_, [self = shared_from_this()] { self->do_connect(); });
  }

  void resume() override {
    asio::dispatch(ex_, [self = shared_from_this()] {
      if (!self->paused_ || self->done_) return;
      self->paused_ = false;
      self->arm(self->req_.max_gap_ms, UpstreamFailure::gap_timeout);
      self->read_body();
    });
  }

  void cancel() override {
    asio::dispatch(ex_, [self = shared_from_this()] { self->finish(UpstreamFailure::cancelled, "cancelled by the gateway"); });
  }

 private:
  std::string where() const {
    return req_.method + " http://" + req_.host + ":" + std::to_string(req_.port) + req_.target;
  }

  void arm(int ms, UpstreamFailure kind) {
    timer_.expires_after(std::chrono::milliseconds(std::max(1, ms)));
    armed_kind_ = kind;
    armed_ms_ = ms;
    timer_.async_wait([self = shared_from_this(), gen = ++timer_gen_](error_code ec) {
      if (ec || gen != self->timer_gen_ || self->done_) return;
      const std::string within = std::to_string(self->armed_ms_) + " ms";
      std::string what = self->armed_kind_ == UpstreamFailure::connect_timeout
                             ? "could not connect to the engine within " + within
                         : self->armed_kind_ == UpstreamFailure::first_byte_timeout
                             ? "no first byte from the engine within " + within
                             : "no event from the engine within " + within + " of the last one";
      self->finish(self->armed_kind_, what + " (" + self->where() + ")");
    });
  }

  void arm_total() {
    if (req_.total_timeout_ms <= 0) return;
    total_timer_.expires_after(std::chrono::milliseconds(req_.total_timeout_ms));
    total_timer_.async_wait([self = shared_from_this()](error_code ec) {
      if (ec || self->done_) return;
      self->finish(UpstreamFailure::request_timeout, "the engine did not complete its answer within " +
                                                         std::to_string(self->req_.total_timeout_ms) + " ms (" +
                                                         self->where() + ")");
    });
  }

  void do_connect() {
    if (done_) return;
    arm_total();
    arm(req_.connect_timeout_ms, UpstreamFailure::connect_timeout);
    error_code ec;
    auto addr = asio::ip::make_address(req_.host, ec);
    if (!ec) {
      socket_.async_connect(tcp::endpoint(addr, static_cast<unsigned short>(req_.port)),
                            [self = shared_from_this()](error_code e) { self->on_connect(e); });
      return;
    }
    resolver_.async_resolve(req_.host, std::to_string(req_.port),
                            [self = shared_from_this()](error_code e, tcp::resolver::results_type r) {
                              if (self->done_) return;
                              if (e) return self->finish(UpstreamFailure::connect, "resolve " + self->where() + ": " + e.message());
                              asio::async_connect(self->socket_, r, [self](error_code ce, const tcp::endpoint&) {
                                self->on_connect(ce);
                              });
                            });
  }

  void on_connect(error_code ec) {
    if (done_) return;
    if (ec) return finish(UpstreamFailure::connect, "connect " + where() + ": " + ec.message());
    error_code ignored;
    socket_.set_option(tcp::no_delay(true), ignored);
    if (req_.total_timeout_ms > 0) {
      ++timer_gen_;  // the total deadline alone bounds the wait for the answer
      timer_.cancel();
    } else {
      arm(req_.first_byte_timeout_ms, UpstreamFailure::first_byte_timeout);
    }
    msg_.emplace(bhttp::string_to_verb(req_.method), req_.target, 11);
    msg_->set(bhttp::field::host, req_.host + ":" + std::to_string(req_.port));
    msg_->set(bhttp::field::content_type, "application/json");
    msg_->set(bhttp::field::accept, "application/json, text/event-stream");
    msg_->set(bhttp::field::accept_encoding, "identity");  // the proxy reads no compressed body
    msg_->body() = std::move(req_.body);
    msg_->prepare_payload();
    bhttp::async_write(socket_, *msg_, [self = shared_from_this()](error_code e, std::size_t) {
      if (self->done_) return;
      if (e) return self->finish(UpstreamFailure::io, "write " + self->where() + ": " + e.message());
      self->msg_.reset();
      self->read_head();
    });
  }

  /// Reads the next response head into a fresh parser (the one before may hold an interim 1xx).
  void read_head() {
    parser_.emplace();
    parser_->body_limit(std::uint64_t{1} << 62);  // note: boost::none trips a Beast 1.74 bug (len > none)
    bhttp::async_read_header(socket_, buffer_, *parser_,
                             [self = shared_from_this()](error_code he, std::size_t) { self->on_header(he); });
  }

  void on_header(error_code ec) {
    if (done_) return;
    if (ec) return finish(classify(ec), "reading the response head of " + where() + ": " + ec.message());
    const unsigned status = parser_->get().result_int();
    if (status == 101)
      return finish(UpstreamFailure::io, "the engine answered " + where() +
                                             " with 101 Switching Protocols; expected a final HTTP/1.1 response");
    if (status >= 100 && status <= 199) {
      // RFC 9110 section 15.2: an interim response (100 Continue, 103 Early Hints) precedes the
      // final one on the same connection; it has no body.
      if (++interim_responses_ > k_max_interim_responses)
        return finish(UpstreamFailure::io, "the engine sent more than " + std::to_string(k_max_interim_responses) +
                                               " interim 1xx responses to " + where() + " (the last: " +
                                               std::to_string(status) + "); expected a final response after them");
      return read_head();
    }
    std::map<std::string, std::string> headers;
    for (const auto& f : parser_->get()) {
      std::string name(f.name_string());
      std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::tolower(c); });
      headers[name] = std::string(f.value());
    }
    // Callbacks run from a copy: one may cancel this call, and finish() then clears cb_, which
    // must not destroy the closure that is running (nor the owner it keeps alive).
    if (auto on_head = cb_.on_head) on_head(static_cast<int>(status), headers);
    if (done_) return;  // on_head may cancel
    read_body();
  }

  void read_body() {
    if (parser_->is_done()) return finish(UpstreamFailure::none, {});
    parser_->get().body().data = buf_;
    parser_->get().body().size = sizeof(buf_);
    bhttp::async_read_some(socket_, buffer_, *parser_, [self = shared_from_this()](error_code ec, std::size_t) {
      self->on_body(ec);
    });
  }

  void on_body(error_code ec) {
    if (done_) return;
    if (ec == bhttp::error::need_buffer) ec = {};
    std::size_t n = sizeof(buf_) - parser_->get().body().size;
    if (n > 0) {
      got_body_ = true;
      if (auto on_data = cb_.on_data) on_data(std::string_view(buf_, n));
      if (done_) return;
      auto progressed = cb_.made_progress;  // a copy, as for on_data
      if (!progressed || progressed()) arm(req_.max_gap_ms, UpstreamFailure::gap_timeout);
    }
    if (ec) return finish(classify(ec), "reading the response body of " + where() + ": " + ec.message());
    if (n > 0 && !parser_->is_done() && should_pause()) {
      paused_ = true;
      ++timer_gen_;  // the client is slow, not the engine: no gap deadline while paused
      timer_.cancel();
      return;
    }
    read_body();
  }

  bool should_pause() {
    auto ask = cb_.should_pause;  // a copy, as for on_data
    return ask && ask();
  }

  UpstreamFailure classify(error_code ec) const {
    if (ec == asio::error::eof || ec == bhttp::error::end_of_stream || ec == bhttp::error::partial_message ||
        ec == asio::error::connection_reset)
      return UpstreamFailure::closed;
    return UpstreamFailure::io;
  }

  void finish(UpstreamFailure f, const std::string& detail) {
    if (done_) return;
    done_ = true;
    ++timer_gen_;
    timer_.cancel();
    total_timer_.cancel();
    resolver_.cancel();
    error_code ignored;
    socket_.shutdown(tcp::socket::shutdown_both, ignored);
    socket_.close(ignored);
    auto on_end = std::move(cb_.on_end);
    cb_ = {};
    if (on_end) on_end(f, detail);
  }

  asio::any_io_executor ex_;
  UpstreamRequest req_;
  UpstreamCallbacks cb_;
  tcp::socket socket_;
  asio::steady_timer timer_;
  asio::steady_timer total_timer_;  // UpstreamRequest::total_timeout_ms
  tcp::resolver resolver_;
  boost::beast::flat_buffer buffer_;
  std::optional<bhttp::request<bhttp::string_body>> msg_;
  std::optional<bhttp::response_parser<bhttp::buffer_body>> parser_;  // the response being read (read_head)
  char buf_[16384];
  UpstreamFailure armed_kind_ = UpstreamFailure::connect_timeout;
  int armed_ms_ = 0;
  uint64_t timer_gen_ = 0;
  int interim_responses_ = 0;  // 1xx heads skipped before the final one
  bool got_body_ = false;
  bool paused_ = false;
  bool done_ = false;
};

}  // namespace

std::shared_ptr<UpstreamCall> start_upstream(asio::any_io_executor executor, UpstreamRequest req, UpstreamCallbacks cb) {
  auto call = std::make_shared<Call>(std::move(executor), std::move(req), std::move(cb));
  call->start();
  return call;
}

}  // namespace servedeck::gateway
