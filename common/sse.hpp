// Server-sent events (SSE): an incremental parser for upstream streams and a formatter for
// events we send. Used by the gateway (engine → client) and by the worker (engine → client).
//
// Wire format (WHATWG HTML §9.2 "Server-sent events"): lines separated by LF, CRLF or CR; a
// blank line dispatches the event; "data:" lines are joined with LF; lines starting with ':'
// are comments (heartbeats). OpenAI-compatible engines send one JSON object per `data:` line
// and end with `data: [DONE]`.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace servedeck::sse {

/// One dispatched event. `data` has its "data:" lines joined with '\n'.
struct Event {
  std::string event;  // the "event:" field, empty when absent
  std::string data;
  bool comment = false;  // true for a ':' comment line (data holds the text after ':')
};

/// Incremental SSE parser. Feed bytes as they arrive, in chunks split anywhere (inside a
/// line, inside a CRLF pair, inside a UTF-8 sequence); complete events come out in order.
/// Not thread-safe: one parser per stream.
class Parser {
 public:
  /// What an event larger than `max_event_bytes` does.
  enum class OnOverflow {
    skip_event,  // overflow() is set, the event is dropped, parsing goes on after its blank line
    stop,        // overflow() is set and the parser stops: feed() returns the events completed
                 // before the oversized one, and nothing after (the stream is to be failed)
  };

  /// `max_event_bytes` bounds one event's size (its data and the line being read), bytes.
  explicit Parser(std::size_t max_event_bytes = 16 * 1024 * 1024, OnOverflow on_overflow = OnOverflow::skip_event);

  /// Appends `bytes` and returns every event completed by them.
  std::vector<Event> feed(std::string_view bytes);

  /// At end of stream: the event still pending without its blank line, if any had data.
  /// (Engines that close right after `data: {...}\n` without the blank line still count.)
  std::optional<Event> finish();

  /// True once an event exceeded `max_event_bytes`.
  bool overflow() const { return overflow_; }

  /// Bytes buffered and not yet dispatched.
  std::size_t pending_bytes() const { return line_.size() + current_.data.size(); }

 private:
  void take_line(std::string_view line, std::vector<Event>& out);

  std::size_t max_event_bytes_;
  OnOverflow on_overflow_;
  std::string line_;
  Event current_;
  bool has_data_ = false;
  bool last_was_cr_ = false;
  bool overflow_ = false;
  bool skipping_ = false;
};

/// `data: <payload>\n\n`. Payload must not contain a newline (JSON from nlohmann::dump() never
/// does); a payload with newlines is split into several data lines.
std::string format_data(std::string_view payload);

/// `: <text>\n\n` — a comment, used as a heartbeat that clients ignore.
std::string format_comment(std::string_view text);

/// `data: [DONE]\n\n`
inline constexpr std::string_view k_done = "data: [DONE]\n\n";

}  // namespace servedeck::sse
