// One sequence's blocks in the KV pool (kv_block_pool.hpp): its block table, the token ids
// whose K/V it stores, and the keys of its full blocks. With prefix caching on, a new sequence
// starts from the longest cached run of full blocks that begins its prompt (attach_prefix), and
// every block it fills is published for later sequences (append): the next turn of the same
// conversation, a sub-agent with the same system prompt, or the same request again.
//
// Usage (the engine's, and tools' through forward_sequence):
//   seq.attach_prefix(prompt);          // positions [0, reused) now hold cached K/V
//   seq.reserve(seq.length() + n);       // blocks for n more positions (may evict cached ones)
//   backend.forward(seq.view(), next_n_tokens, ...);
//   seq.append(next_n_tokens);           // length += n; full blocks published
//   seq.release();                       // blocks back to the pool, the tail first
//
// Memory: the tables grow to the sequence's length and keep their capacity across release(),
// so a sequence object reused request after request stops allocating.
// Thread-safety: none (as the pool).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "worker/engine/backend.hpp"
#include "worker/engine/kv_block_pool.hpp"

namespace servedeck::worker {

class KvSequence {
 public:
  /// `cache_prefixes`: look prefixes up and publish full blocks; false: private blocks only
  /// (EngineOptions::prefix_caching off).
  KvSequence(KvBlockPool& pool, bool cache_prefixes);
  ~KvSequence();
  KvSequence(const KvSequence&) = delete;
  KvSequence& operator=(const KvSequence&) = delete;

  /// On an empty sequence: takes the longest run of cached full blocks that starts `prompt`,
  /// at most `max_tokens` tokens of it (rounded down to whole blocks), and returns the tokens
  /// reused (a multiple of block_tokens; 0 without prefix caching).
  std::size_t attach_prefix(std::span<const int32_t> prompt, std::size_t max_tokens);
  /// Makes room for `tokens` positions, allocating blocks (and so evicting the least recently
  /// used cached blocks when no block is empty); false when the pool has no block left for it
  /// (the blocks it got stay with the sequence).
  bool reserve(std::size_t tokens);
  /// The view a forward pass over this sequence takes; valid until the next call that changes
  /// the sequence.
  KvView view() const { return KvView{blocks_, tokens_.size()}; }
  /// Records that the K/V of `tokens` was written at [length(), length() + n) (the blocks must
  /// be reserved), and publishes each block that became full.
  void append(std::span<const int32_t> tokens);
  /// Positions stored, tokens.
  std::size_t length() const { return tokens_.size(); }
  /// Tokens the reserved blocks can hold.
  std::size_t room() const { return blocks_.size() * pool_.shape().block_tokens; }
  /// Returns every block to the pool, the last first (so a conversation's tail is evicted before
  /// its shared head), and empties the sequence.
  void release();

 private:
  KvBlockPool& pool_;
  bool cache_;
  std::vector<int32_t> blocks_;     // block table
  std::vector<int32_t> tokens_;     // ids at positions [0, length)
  std::vector<uint64_t> keys_;      // chained key of each full block
  std::vector<KvBlockRef> chain_;   // the indexed block holding each full block's contents (its parent for the next)
};

/// For tools and tests: reserves room for `tokens` in `seq`, runs backend.forward(seq.view(),
/// tokens, all_logits) and appends them. Throws KvCacheFull (nothing appended) when the pool has
/// no room, and as Backend::forward.
std::vector<float> forward_sequence(Backend& backend, KvSequence& seq, std::span<const int32_t> tokens, bool all_logits);

}  // namespace servedeck::worker
