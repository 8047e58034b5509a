#include "worker/engine/backend.hpp"

#include <stdexcept>
#include <string>

#include "worker/engine/sampler.hpp"

namespace servedeck::worker {

std::string_view to_string(KvDtype d) {
  switch (d) {
    case KvDtype::bf16: return "bf16";
    case KvDtype::f32: return "f32";
  }
  return "unknown";
}

std::size_t kv_dtype_bytes(KvDtype d) { return d == KvDtype::bf16 ? 2 : 4; }

int32_t Backend::forward_greedy(const KvView& kv, int32_t token) {
  const int32_t one[1] = {token};
  const std::vector<float> logits = forward(kv, one, false);
  if (logits.size() < vocab_size())
    throw std::runtime_error("backend returned " + std::to_string(logits.size()) + " logits for one token; expected " +
                             std::to_string(vocab_size()));
  return argmax(std::span<const float>(logits.data(), vocab_size()));
}

Backend::TopLogits Backend::forward_top_k(const KvView& kv, int32_t token, int k) {
  if (k < 1 || k > max_top_k())
    throw std::invalid_argument("forward_top_k: k must be in [1, " + std::to_string(max_top_k()) + "], got " + std::to_string(k));
  const int32_t one[1] = {token};
  const std::vector<float> logits = forward(kv, one, false);
  if (logits.size() < vocab_size())
    throw std::runtime_error("backend returned " + std::to_string(logits.size()) + " logits for one token; expected " +
                             std::to_string(vocab_size()));
  const std::span<const float> row(logits.data(), vocab_size());
  return TopLogits{top_logits(row, static_cast<std::size_t>(k)), argmax(row)};
}

}  // namespace servedeck::worker
