// The gateway's asynchronous client to an engine: one HTTP/1.1 request per call, the response
// body handed over as it arrives, with the model's deadlines (ModelEntry::connect_timeout_ms,
// first_byte_timeout_ms, max_gap_ms) and cancel() for a client that went away.
//
// Deadlines:
//   connect     — TCP connect (name resolution included);
//   first byte  — from the request being written until the first body read that made
//                 progress (UpstreamCallbacks::made_progress; without it, any body bytes): for
//                 the proxy's stream, a complete data event, i.e. TTFT; SSE comments and event
//                 fragments do not count;
//   gap         — between two body reads that made progress, after the first;
//   total       — when set (a non-streaming request: ModelEntry::request_timeout_s), the whole
//                 exchange from connect to the end of the body; it replaces the first-byte
//                 deadline, which for a body that arrives at once would bound the generation.
//
// Interim responses: up to 8 (k_max_interim_responses) 1xx heads before the final one (100
// Continue, 103 Early Hints; RFC 9110 section 15.2) are read and skipped, on_head sees the final
// status only; a 101, or a 9th interim head, ends the call with `io` naming it.
//
// Threading: every callback runs on `executor` (a strand the caller owns), one at a time, and
// on_end runs exactly once unless cancel() came first (then it runs with `cancelled`).
// cancel() may be called from any thread, including from inside a callback (on `executor` it
// closes at once and runs on_end before returning; a callback's closure stays alive until it
// returns, so its captures may own the caller). Never throws.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>

#include <boost/asio/any_io_executor.hpp>

namespace servedeck::gateway {

enum class UpstreamFailure {
  none,                // the body ended cleanly (Content-Length reached or final chunk)
  connect,             // connection refused / unreachable
  connect_timeout,
  first_byte_timeout,
  gap_timeout,
  request_timeout,     // the total deadline (UpstreamRequest::total_timeout_ms)
  closed,              // the engine closed the connection before the body ended
  io,                  // other read/write failure, malformed HTTP
  cancelled,
};
std::string_view to_string(UpstreamFailure f);

struct UpstreamRequest {
  std::string host = "127.0.0.1";
  int port = 0;
  std::string method = "POST";
  std::string target;
  std::string body;
  int connect_timeout_ms = 5000;
  int first_byte_timeout_ms = 600000;
  int max_gap_ms = 120000;
  int total_timeout_ms = 0;  // 0 = none; otherwise the whole exchange, and no first-byte deadline
};

struct UpstreamCallbacks {
  std::function<void(int status, const std::map<std::string, std::string>& headers)> on_head;
  std::function<void(std::string_view bytes)> on_data;
  std::function<void(UpstreamFailure failure, const std::string& detail)> on_end;
  /// Asked after each on_data: true pauses reading (backpressure from a slow client) until
  /// resume(). While paused the gap deadline does not run.
  std::function<bool()> should_pause;
  /// Asked after each on_data: whether those bytes completed something that counts as the
  /// engine's progress (for a stream: a data event, not a comment nor a fragment). Only progress
  /// replaces the running first-byte or gap deadline by a fresh gap deadline, so an engine that
  /// sends only `: keepalive` comments, or one event a byte at a time, still meets its deadlines.
  /// Unset: every byte is progress.
  std::function<bool()> made_progress;
};

class UpstreamCall {
 public:
  virtual ~UpstreamCall() = default;
  /// Closes the connection at once (the engine sees it closed and stops generating); on_end runs
  /// with `cancelled`.
  virtual void cancel() = 0;
  /// Resumes reading after should_pause() returned true. Any thread; no effect otherwise.
  virtual void resume() = 0;
};

/// Starts the request. The returned handle keeps nothing alive by itself; the call lives until
/// on_end has run.
std::shared_ptr<UpstreamCall> start_upstream(boost::asio::any_io_executor executor, UpstreamRequest req,
                                             UpstreamCallbacks cb);

}  // namespace servedeck::gateway
