#include "worker/engine/backend.hpp"

#include <stdexcept>
#include <string>

#include "worker/engine/sampler.hpp"

namespace servedeck::worker {

int32_t Backend::forward_greedy(KvCache& cache, int32_t token) {
  const int32_t one[1] = {token};
  const std::vector<float> logits = forward(cache, one, false);
  if (logits.size() < vocab_size())
    throw std::runtime_error("backend returned " + std::to_string(logits.size()) + " logits for one token; expected " +
                             std::to_string(vocab_size()));
  return argmax(std::span<const float>(logits.data(), vocab_size()));
}

}  // namespace servedeck::worker
