// A Backend over one contiguous K/V cache: the adapter for a backend whose kernels keep a
// sequence's K/V in one contiguous buffer (the CUDA backend, worker/cuda/, until its attention
// reads the pool through block tables). It implements the pool on top of new_cache():
//
// - allocate_kv_pool(shape) makes ONE cache of shape.tokens() tokens, once at start (no
//   allocation per request; for the CUDA backend also one decode graph, captured on the first
//   decode step and replayed by every later request);
// - it holds one sequence at a time: a forward pass at position 0 starts a new sequence
//   (the cache is emptied), any other position must continue the sequence it holds;
// - reads_block_tables() is false, so the engine reuses no prefix with it.
//
// The block table is checked for room (KvCacheFull, as a paged backend) and otherwise unused.
// A subclass that overrides the contiguous forward / forward_greedy brings the pool's overloads
// back into its scope (`using ContiguousKvBackend::forward;`), or they are hidden there (nvcc
// warns, #997).
//
// Thread-safety: as Backend (one forward at a time).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "worker/engine/backend.hpp"

namespace servedeck::worker {

class ContiguousKvBackend : public Backend {
 public:
  /// A contiguous cache holding up to `max_tokens` tokens.
  virtual std::unique_ptr<KvCache> new_cache(std::size_t max_tokens) = 0;
  /// Runs `tokens` at positions [cache.length(), cache.length() + n) and appends them to the
  /// cache; logits as Backend::forward. Throws KvCacheFull (nothing appended) when
  /// cache.length() + n > cache.capacity().
  virtual std::vector<float> forward(KvCache& cache, std::span<const int32_t> tokens, bool all_logits) = 0;
  /// Greedy step on a contiguous cache, as Backend::forward_greedy. Default: forward + argmax
  /// (std::runtime_error on a row shorter than vocab_size()).
  virtual int32_t forward_greedy(KvCache& cache, int32_t token);

  /// One cache of shape.tokens() tokens (new_cache), replacing any earlier one.
  void allocate_kv_pool(const KvPoolShape& shape) final;
  std::size_t kv_pool_allocations() const final { return allocations_; }
  bool reads_block_tables() const final { return false; }
  /// forward(cache, ...) on the one cache; std::logic_error when kv.length is neither 0 (a new
  /// sequence) nor within the sequence the cache holds.
  std::vector<float> forward(const KvView& kv, std::span<const int32_t> tokens, bool all_logits) final;
  int32_t forward_greedy(const KvView& kv, int32_t token) final;

 private:
  /// The checks of a pass of `n` tokens at kv.length, then the cache rewound to kv.length.
  KvCache& follow(const KvView& kv, std::size_t n);

  std::unique_ptr<KvCache> cache_;  // capacity shape_.tokens()
  KvPoolShape shape_;
  std::size_t allocations_ = 0;
};

}  // namespace servedeck::worker
