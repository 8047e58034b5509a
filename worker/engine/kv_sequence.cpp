#include "worker/engine/kv_sequence.hpp"

#include <stdexcept>
#include <string>

namespace servedeck::worker {

KvSequence::KvSequence(KvBlockPool& pool, bool cache_prefixes) : pool_(pool), cache_(cache_prefixes) {}

KvSequence::~KvSequence() { release(); }

std::size_t KvSequence::attach_prefix(std::span<const int32_t> prompt, std::size_t max_tokens) {
  if (!tokens_.empty() || !blocks_.empty()) throw std::logic_error("attach_prefix on a sequence that is not empty");
  if (!cache_) return 0;
  const std::size_t bt = pool_.shape().block_tokens;
  const std::size_t blocks = std::min(prompt.size(), max_tokens) / bt;
  uint64_t key = KvBlockPool::k_first_key;
  KvBlockRef parent;
  for (std::size_t i = 0; i < blocks; ++i) {
    const auto block_tokens = prompt.subspan(i * bt, bt);
    key = KvBlockPool::chain_key(key, block_tokens);
    const auto b = pool_.acquire(key, block_tokens, parent);
    if (!b) break;
    parent = pool_.ref(*b);
    blocks_.push_back(*b);
    keys_.push_back(key);
    chain_.push_back(parent);
    tokens_.insert(tokens_.end(), block_tokens.begin(), block_tokens.end());
  }
  return tokens_.size();
}

bool KvSequence::reserve(std::size_t tokens) {
  while (room() < tokens) {
    const auto b = pool_.allocate();
    if (!b) return false;
    blocks_.push_back(*b);
  }
  return true;
}

void KvSequence::append(std::span<const int32_t> tokens) {
  if (tokens_.size() + tokens.size() > room())
    throw std::logic_error("KvSequence::append: " + std::to_string(tokens_.size() + tokens.size()) +
                           " positions need more than the " + std::to_string(room()) + " reserved");
  tokens_.insert(tokens_.end(), tokens.begin(), tokens.end());
  const std::size_t bt = pool_.shape().block_tokens;
  while (keys_.size() < tokens_.size() / bt) {
    const std::size_t i = keys_.size();
    const std::span<const int32_t> block_tokens(tokens_.data() + i * bt, bt);
    const uint64_t key = KvBlockPool::chain_key(i == 0 ? KvBlockPool::k_first_key : keys_[i - 1], block_tokens);
    // A block after one that could not be indexed (a collision) chains to our own copy, which
    // no lookup reaches: it is then private to this sequence, as without caching.
    KvBlockRef held = pool_.ref(blocks_[i]);
    if (cache_) {
      const KvBlockRef parent = i == 0 ? KvBlockRef{} : chain_[i - 1];
      if (const auto indexed = pool_.publish(blocks_[i], key, block_tokens, parent)) held = *indexed;
    }
    keys_.push_back(key);
    chain_.push_back(held);
  }
}

void KvSequence::release() {
  for (auto it = blocks_.rbegin(); it != blocks_.rend(); ++it) pool_.release(*it);
  blocks_.clear();
  tokens_.clear();
  keys_.clear();
  chain_.clear();
}

std::vector<float> forward_sequence(Backend& backend, KvSequence& seq, std::span<const int32_t> tokens, bool all_logits) {
  if (!seq.reserve(seq.length() + tokens.size()))
    throw KvCacheFull("KV pool full: " + std::to_string(seq.length()) + " cached + " + std::to_string(tokens.size()) +
                      " new tokens = " + std::to_string(seq.length() + tokens.size()) + " exceeds the " +
                      std::to_string(seq.room()) + " tokens the pool could give this sequence");
  auto logits = backend.forward(seq.view(), tokens, all_logits);
  seq.append(tokens);
  return logits;
}

}  // namespace servedeck::worker
