#include "worker/engine/backend.hpp"

#include <algorithm>

#include "worker/engine/sampler.hpp"

namespace servedeck::worker {

int32_t Backend::forward_greedy(KvCache& cache, int32_t token) {
  const int32_t one[1] = {token};
  const std::vector<float> logits = forward(cache, one, false);
  return argmax(std::span<const float>(logits.data(), std::min(logits.size(), vocab_size())));
}

}  // namespace servedeck::worker
