#include "worker/engine/kv_block_pool.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace servedeck::worker {

namespace {

// splitmix64's finaliser (Steele, Lea, Flood 2014): a bijective 64-bit mix.
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

KvBlockPool::KvBlockPool(KvPoolShape shape) : shape_(shape) {
  if (shape.num_blocks == 0 || shape.block_tokens == 0)
    throw std::invalid_argument("KV pool of " + std::to_string(shape.num_blocks) + " blocks of " +
                                std::to_string(shape.block_tokens) + " tokens: expected at least one block of at least one token");
  if (shape.num_blocks > static_cast<std::size_t>(INT32_MAX))
    throw std::invalid_argument("KV pool of " + std::to_string(shape.num_blocks) + " blocks: block ids are int32");
  const std::size_t n = shape.num_blocks;
  refs_.assign(n, 0);
  generation_.assign(n, 0);
  published_.assign(n, 0);
  key_.assign(n, 0);
  parent_.assign(n, KvBlockRef{});
  tokens_.assign(n * shape.block_tokens, 0);
  lru_prev_.assign(n, -1);
  lru_next_.assign(n, -1);
  empty_.reserve(n);
  for (std::size_t i = n; i > 0; --i) empty_.push_back(static_cast<int32_t>(i - 1));  // block 0 first
  index_.reserve(n);
  counts_.empty = n;
}

uint64_t KvBlockPool::chain_key(uint64_t previous_key, std::span<const int32_t> tokens) {
  uint64_t h = mix(previous_key);
  for (const int32_t t : tokens) h = mix(h ^ static_cast<uint32_t>(t));
  return mix(h ^ tokens.size());
}

void KvBlockPool::lru_push_back(int32_t b) {
  lru_prev_[b] = lru_tail_;
  lru_next_[b] = -1;
  if (lru_tail_ >= 0) lru_next_[lru_tail_] = b;
  else lru_head_ = b;
  lru_tail_ = b;
}

void KvBlockPool::lru_remove(int32_t b) {
  const int32_t p = lru_prev_[b], n = lru_next_[b];
  if (p >= 0) lru_next_[p] = n;
  else lru_head_ = n;
  if (n >= 0) lru_prev_[n] = p;
  else lru_tail_ = p;
  lru_prev_[b] = lru_next_[b] = -1;
}

void KvBlockPool::check_held(int32_t b, const char* what) const {
  if (b < 0 || static_cast<std::size_t>(b) >= shape_.num_blocks)
    throw std::out_of_range(std::string(what) + ": block " + std::to_string(b) + " is outside the pool of " +
                            std::to_string(shape_.num_blocks) + " blocks");
  if (refs_[b] == 0) throw std::logic_error(std::string(what) + ": block " + std::to_string(b) + " is not held");
}

std::optional<int32_t> KvBlockPool::allocate() {
  int32_t b = -1;
  if (!empty_.empty()) {
    b = empty_.back();
    empty_.pop_back();
    --counts_.empty;
  } else if (lru_head_ >= 0) {
    b = lru_head_;  // evict the least recently used cached block
    lru_remove(b);
    index_.erase(key_[b]);
    published_[b] = 0;
    --counts_.cached;
    ++counts_.evictions;
  } else {
    return std::nullopt;
  }
  ++generation_[b];
  refs_[b] = 1;
  ++counts_.held;
  return b;
}

bool KvBlockPool::matches(int32_t b, std::span<const int32_t> tokens, KvBlockRef parent) const {
  if (tokens.size() != shape_.block_tokens || !(parent_[b] == parent)) return false;
  const auto* stored = tokens_.data() + static_cast<std::size_t>(b) * shape_.block_tokens;
  return std::equal(tokens.begin(), tokens.end(), stored);
}

std::optional<int32_t> KvBlockPool::acquire(uint64_t key, std::span<const int32_t> tokens, KvBlockRef parent) {
  const auto it = index_.find(key);
  if (it == index_.end() || !matches(it->second, tokens, parent)) return std::nullopt;
  const int32_t b = it->second;
  if (refs_[b]++ == 0) {
    lru_remove(b);
    --counts_.cached;
    ++counts_.held;
  }
  return b;
}

std::optional<KvBlockRef> KvBlockPool::publish(int32_t b, uint64_t key, std::span<const int32_t> tokens, KvBlockRef parent) {
  check_held(b, "publish");
  if (tokens.size() != shape_.block_tokens)
    throw std::invalid_argument("publish: " + std::to_string(tokens.size()) + " tokens for a block of " +
                                std::to_string(shape_.block_tokens));
  if (published_[b]) return ref(b);
  const auto [it, inserted] = index_.try_emplace(key, b);
  if (!inserted) {
    if (matches(it->second, tokens, parent)) return ref(it->second);
    return std::nullopt;
  }
  published_[b] = 1;
  key_[b] = key;
  parent_[b] = parent;
  std::copy(tokens.begin(), tokens.end(), tokens_.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(b) * shape_.block_tokens));
  return ref(b);
}

void KvBlockPool::release(int32_t b) {
  check_held(b, "release");
  if (--refs_[b] > 0) return;
  --counts_.held;
  if (published_[b]) {
    lru_push_back(b);
    ++counts_.cached;
  } else {
    empty_.push_back(b);
    ++counts_.empty;
  }
}

KvBlockRef KvBlockPool::ref(int32_t b) const { return KvBlockRef{b, generation_[b]}; }

KvPoolCounts KvBlockPool::counts() const { return counts_; }

}  // namespace servedeck::worker
