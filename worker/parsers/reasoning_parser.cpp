#include "worker/parsers/reasoning_parser.hpp"

#include <utility>

namespace servedeck::worker {

ReasoningParser::ReasoningParser(bool enabled, bool starts_in_reasoning, std::string open_tag,
                                 std::string close_tag)
    : enabled_(enabled),
      in_reasoning_(enabled && starts_in_reasoning),
      at_start_(enabled && starts_in_reasoning),
      open_(std::move(open_tag)),
      close_(std::move(close_tag)) {}

void ReasoningParser::push(std::string_view text, std::vector<ParseDelta>& out) {
  if (!enabled_) {
    append_text(out, DeltaKind::content, text);
    return;
  }
  buf_ += text;
  for (;;) {
    if (at_start_) {
      // Drop a repeated opening tag at the very start of the block.
      const std::string_view b = buf_;
      if (b.size() < open_.size() && std::string_view(open_).substr(0, b.size()) == b) return;
      if (b.substr(0, open_.size()) == open_) buf_.erase(0, open_.size());
      at_start_ = false;
    }
    const std::string& tag = in_reasoning_ ? close_ : open_;
    const DeltaKind kind = in_reasoning_ ? DeltaKind::reasoning : DeltaKind::content;
    const auto pos = buf_.find(tag);
    if (pos != std::string::npos) {
      append_text(out, kind, std::string_view(buf_).substr(0, pos));
      buf_.erase(0, pos + tag.size());
      in_reasoning_ = !in_reasoning_;
      continue;
    }
    const std::size_t hold = partial_tag_suffix(buf_, tag);
    append_text(out, kind, std::string_view(buf_).substr(0, buf_.size() - hold));
    buf_.erase(0, buf_.size() - hold);
    return;
  }
}

void ReasoningParser::finish(std::vector<ParseDelta>& out) {
  if (!enabled_) return;
  append_text(out, in_reasoning_ ? DeltaKind::reasoning : DeltaKind::content, buf_);
  buf_.clear();
  at_start_ = false;
}

}  // namespace servedeck::worker
