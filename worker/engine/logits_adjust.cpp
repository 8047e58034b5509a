#include "worker/engine/logits_adjust.hpp"

namespace servedeck::worker {

bool LogitsAdjust::active() const {
  return !bias.empty() || presence_penalty != 0.0f || frequency_penalty != 0.0f || repetition_penalty != 1.0f;
}

LogitsAdjuster::LogitsAdjuster(const LogitsAdjust& adjust, std::span<const int32_t> prompt, std::size_t vocab)
    : adjust_(adjust), count_(vocab, 0), seen_(vocab, 0) {
  if (adjust_.repetition_penalty == 1.0f) return;  // the prompt matters only to it
  for (const int32_t t : prompt) {
    if (t < 0 || static_cast<std::size_t>(t) >= vocab || seen_[static_cast<std::size_t>(t)]) continue;
    seen_[static_cast<std::size_t>(t)] = 1;
    seen_ids_.push_back(t);
  }
}

void LogitsAdjuster::push(int32_t token) {
  if (token < 0 || static_cast<std::size_t>(token) >= count_.size()) return;
  const auto j = static_cast<std::size_t>(token);
  if (count_[j]++ == 0) output_ids_.push_back(token);
  if (!seen_[j]) {
    seen_[j] = 1;
    seen_ids_.push_back(token);
  }
}

void LogitsAdjuster::apply(std::span<float> row) const {
  for (const auto& [id, b] : adjust_.bias)
    if (static_cast<std::size_t>(id) < row.size()) row[static_cast<std::size_t>(id)] += b;
  if (const float r = adjust_.repetition_penalty; r != 1.0f) {
    for (const int32_t id : seen_ids_) {
      float& l = row[static_cast<std::size_t>(id)];
      l = l > 0.0f ? l / r : l * r;
    }
  }
  if (adjust_.frequency_penalty != 0.0f || adjust_.presence_penalty != 0.0f) {
    for (const int32_t id : output_ids_) {
      const auto j = static_cast<std::size_t>(id);
      row[j] -= static_cast<float>(count_[j]) * adjust_.frequency_penalty + adjust_.presence_penalty;
    }
  }
}

}  // namespace servedeck::worker
