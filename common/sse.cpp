#include "common/sse.hpp"

namespace servedeck::sse {

Parser::Parser(std::size_t max_event_bytes, OnOverflow on_overflow)
    : max_event_bytes_(max_event_bytes), on_overflow_(on_overflow) {}

std::vector<Event> Parser::feed(std::string_view bytes) {
  std::vector<Event> out;
  if (overflow_ && on_overflow_ == OnOverflow::stop) return out;
  for (char c : bytes) {
    if (last_was_cr_) {
      last_was_cr_ = false;
      if (c == '\n') continue;  // second half of CRLF
    }
    if (c == '\r' || c == '\n') {
      last_was_cr_ = (c == '\r');
      take_line(line_, out);
      line_.clear();
      continue;
    }
    if (line_.size() + current_.data.size() >= max_event_bytes_) {
      overflow_ = true;
      if (on_overflow_ == OnOverflow::stop) {
        line_.clear();
        current_ = Event{};
        has_data_ = false;
        return out;
      }
      skipping_ = true;
      line_.clear();
      current_ = Event{};
      has_data_ = false;
      continue;
    }
    line_.push_back(c);
  }
  return out;
}

void Parser::take_line(std::string_view line, std::vector<Event>& out) {
  if (line.empty()) {
    if (skipping_) {
      skipping_ = false;
    } else if (has_data_) {
      out.push_back(std::move(current_));
    }
    current_ = Event{};
    has_data_ = false;
    return;
  }
  if (skipping_) return;
  if (line.front() == ':') {
    Event c;
    c.comment = true;
    std::string_view text = line.substr(1);
    if (!text.empty() && text.front() == ' ') text.remove_prefix(1);
    c.data = std::string(text);
    out.push_back(std::move(c));
    return;
  }
  std::string_view field = line;
  std::string_view value;
  if (auto colon = line.find(':'); colon != std::string_view::npos) {
    field = line.substr(0, colon);
    value = line.substr(colon + 1);
    if (!value.empty() && value.front() == ' ') value.remove_prefix(1);
  }
  if (field == "data") {
    if (has_data_) current_.data.push_back('\n');
    current_.data.append(value);
    has_data_ = true;
  } else if (field == "event") {
    current_.event = std::string(value);
  }
  // "id" and "retry" are not used by OpenAI-style streams; ignored as the spec allows.
}

std::optional<Event> Parser::finish() {
  if (overflow_ && on_overflow_ == OnOverflow::stop) return std::nullopt;
  std::vector<Event> out;
  if (!line_.empty()) {
    take_line(line_, out);
    line_.clear();
  }
  if (has_data_ && !skipping_) {
    has_data_ = false;
    Event e = std::move(current_);
    current_ = Event{};
    return e;
  }
  return std::nullopt;
}

std::string format_data(std::string_view payload) {
  std::string out;
  out.reserve(payload.size() + 8);
  std::size_t start = 0;
  while (true) {
    auto nl = payload.find('\n', start);
    out += "data: ";
    out.append(payload.substr(start, nl == std::string_view::npos ? std::string_view::npos : nl - start));
    out += '\n';
    if (nl == std::string_view::npos) break;
    start = nl + 1;
  }
  out += '\n';
  return out;
}

std::string format_comment(std::string_view text) {
  std::string out = ": ";
  out.append(text);
  out += "\n\n";
  return out;
}

}  // namespace servedeck::sse
