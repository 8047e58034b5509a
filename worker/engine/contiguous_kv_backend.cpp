#include "worker/engine/contiguous_kv_backend.hpp"

#include <string>

#include "worker/engine/sampler.hpp"

namespace servedeck::worker {

int32_t ContiguousKvBackend::forward_greedy(KvCache& cache, int32_t token) {
  const int32_t one[1] = {token};
  const std::vector<float> logits = forward(cache, one, false);
  if (logits.size() < vocab_size())
    throw std::runtime_error("backend returned " + std::to_string(logits.size()) + " logits for one token; expected " +
                             std::to_string(vocab_size()));
  return argmax(std::span<const float>(logits.data(), vocab_size()));
}

void ContiguousKvBackend::allocate_kv_pool(const KvPoolShape& shape) {
  if (shape.num_blocks == 0 || shape.block_tokens == 0)
    throw std::invalid_argument("KV pool of " + std::to_string(shape.num_blocks) + " blocks of " +
                                std::to_string(shape.block_tokens) + " tokens: expected at least one block of at least one token");
  cache_.reset();  // free the old cache before asking for the new one
  cache_ = new_cache(shape.tokens());
  shape_ = shape;
  ++allocations_;
}

KvCache& ContiguousKvBackend::follow(const KvView& kv, std::size_t n) {
  if (!cache_) throw std::logic_error("forward before allocate_kv_pool: the backend has no KV cache yet");
  const std::size_t room = kv.blocks.size() * shape_.block_tokens;
  if (kv.length + n > room)
    throw KvCacheFull("KV cache full: " + std::to_string(kv.length) + " cached + " + std::to_string(n) + " new tokens = " +
                      std::to_string(kv.length + n) + " exceeds the sequence's " + std::to_string(kv.blocks.size()) +
                      " blocks of " + std::to_string(shape_.block_tokens) + " tokens");
  if (kv.length > cache_->length())
    throw std::logic_error("this backend keeps one sequence's K/V contiguous: a pass at position " +
                           std::to_string(kv.length) + " continues no sequence (the cache holds " +
                           std::to_string(cache_->length()) + " tokens)");
  cache_->truncate(kv.length);  // 0: a new sequence; else the sequence's own rewind (or none)
  return *cache_;
}

std::vector<float> ContiguousKvBackend::forward(const KvView& kv, std::span<const int32_t> tokens, bool all_logits) {
  return forward(follow(kv, tokens.size()), tokens, all_logits);
}

int32_t ContiguousKvBackend::forward_greedy(const KvView& kv, int32_t token) {
  return forward_greedy(follow(kv, 1), token);
}

}  // namespace servedeck::worker
