#include "worker/engine/stop_matcher.hpp"

#include <algorithm>
#include <utility>

namespace servedeck::worker {

StopMatcher::StopMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {
  std::erase_if(stops_, [](const std::string& s) { return s.empty(); });
}

std::string StopMatcher::push(std::string_view text) {
  if (stopped_) return {};
  held_ += text;
  std::size_t first = std::string::npos;
  for (const auto& s : stops_) {
    const auto pos = held_.find(s);
    if (pos != std::string::npos && pos < first) {
      first = pos;
      matched_ = s;
    }
  }
  if (first != std::string::npos) {
    stopped_ = true;
    std::string out = held_.substr(0, first);
    held_.clear();
    return out;
  }
  // Hold the longest suffix that is a proper prefix of some stop string.
  std::size_t hold = 0;
  for (const auto& s : stops_) {
    const std::size_t max_len = std::min(held_.size(), s.size() - 1);
    for (std::size_t len = max_len; len > hold; --len) {
      if (std::string_view(held_).substr(held_.size() - len) == std::string_view(s).substr(0, len)) {
        hold = len;
        break;
      }
    }
  }
  std::string out = held_.substr(0, held_.size() - hold);
  held_.erase(0, held_.size() - hold);
  return out;
}

std::string StopMatcher::flush() {
  if (stopped_) return {};
  return std::exchange(held_, {});
}

std::string Utf8Holdback::push(std::string_view bytes) {
  pending_ += bytes;
  // Find where an incomplete trailing sequence starts (look back at most 3 bytes).
  std::size_t cut = pending_.size();
  for (std::size_t back = 1; back <= 3 && back <= pending_.size(); ++back) {
    const auto c = static_cast<unsigned char>(pending_[pending_.size() - back]);
    if ((c & 0xC0) == 0x80) continue;  // continuation byte: keep looking for the lead
    std::size_t need = 1;
    if ((c & 0xE0) == 0xC0) need = 2;
    else if ((c & 0xF0) == 0xE0) need = 3;
    else if ((c & 0xF8) == 0xF0) need = 4;
    if (need > back) cut = pending_.size() - back;
    break;
  }
  std::string out = pending_.substr(0, cut);
  pending_.erase(0, cut);
  return out;
}

std::string Utf8Holdback::flush() { return std::exchange(pending_, {}); }

}  // namespace servedeck::worker
