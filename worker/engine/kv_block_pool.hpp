// The engine's bookkeeping of the KV pool (the storage is the backend's, backend.hpp): which
// blocks running sequences hold, which keep a cached prefix that no sequence holds (evictable,
// least recently used first), which are empty; and the prefix index that finds a cached block
// by the chained hash of its tokens (vLLM's automatic prefix caching: a full block's key is
// hash(key of the block before it, its block_tokens token ids)).
//
// Block states (every block is in exactly one):
//
//   empty  --allocate-->  held, unpublished (ref 1, a new generation)
//   held   --publish-->   held, published (findable by its key)
//   held   --release, ref 0-->  empty (unpublished) | cached (published: the LRU list's newest)
//   cached --acquire-->   held, published (ref 1)
//   cached --allocate when no block is empty: the LRU list's oldest-->  held, unpublished (evicted)
//
// A block's contents are named by (id, generation): the generation grows each time the block is
// allocated. A published block records its tokens and the (id, generation) of the block before
// it; a lookup accepts a block only when both match what the caller has, so a hit is exact: a
// hash collision, or a parent evicted and reused since, is a miss, never wrong K/V.
//
// Memory: every table is sized num_blocks at construction (tokens: num_blocks × block_tokens
// int32); later calls allocate only the prefix index's nodes.
// Thread-safety: none; the engine's scheduler thread owns the pool.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "worker/engine/backend.hpp"

namespace servedeck::worker {

/// A block's contents: its id and the generation it was allocated in. id -1: none (the first
/// block of a sequence has no parent).
struct KvBlockRef {
  int32_t id = -1;
  uint64_t generation = 0;
  bool operator==(const KvBlockRef&) const = default;
};

/// Block counts (held + cached + empty == num_blocks) and evictions since construction.
struct KvPoolCounts {
  std::size_t held = 0;       // referenced by a running sequence
  std::size_t cached = 0;     // published, no reference: reusable, evictable
  std::size_t empty = 0;
  std::size_t evictions = 0;  // cached blocks taken for new contents
};

class KvBlockPool {
 public:
  /// Throws std::invalid_argument when the shape has no blocks or no rows per block.
  explicit KvBlockPool(KvPoolShape shape);

  const KvPoolShape& shape() const { return shape_; }

  /// Key of a full block: hash of the previous block's key (k_first_key for the first block) and
  /// its block_tokens ids. 64-bit, not cryptographic (a collision only costs a miss).
  static uint64_t chain_key(uint64_t previous_key, std::span<const int32_t> tokens);
  static constexpr uint64_t k_first_key = 0x6b765f706f6f6c31ull;

  /// A block for new contents (ref 1): an empty one, else the least recently used cached block,
  /// evicted (its key leaves the index). nullopt when every block is held.
  std::optional<int32_t> allocate();
  /// The cached or held block published under `key` with exactly `tokens` after `parent`, with
  /// one more reference; nullopt on a miss.
  std::optional<int32_t> acquire(uint64_t key, std::span<const int32_t> tokens, KvBlockRef parent);
  /// Publishes held block `block`, now full with `tokens` (block_tokens ids) after `parent`,
  /// under `key`, and returns the block that holds these contents in the index: `block`
  /// itself, or a block published earlier with the same key, tokens and parent (then `block`
  /// stays unpublished: a duplicate, freed when released). nullopt when another block holds the
  /// key with other contents (a collision: `block` is not findable).
  std::optional<KvBlockRef> publish(int32_t block, uint64_t key, std::span<const int32_t> tokens, KvBlockRef parent);
  /// Drops one reference to held block `block`; at zero it becomes cached (published, the
  /// newest in the LRU order) or empty.
  void release(int32_t block);

  /// The block's current (id, generation).
  KvBlockRef ref(int32_t block) const;
  KvPoolCounts counts() const;

 private:
  bool matches(int32_t block, std::span<const int32_t> tokens, KvBlockRef parent) const;
  void lru_push_back(int32_t block);
  void lru_remove(int32_t block);
  void check_held(int32_t block, const char* what) const;

  KvPoolShape shape_;
  std::vector<uint32_t> refs_;         // (num_blocks) references by sequences
  std::vector<uint64_t> generation_;   // (num_blocks)
  std::vector<uint8_t> published_;     // (num_blocks) 1: key_ and tokens_ are valid and indexed
  std::vector<uint64_t> key_;          // (num_blocks)
  std::vector<KvBlockRef> parent_;     // (num_blocks) the block before it when published
  std::vector<int32_t> tokens_;        // (num_blocks, block_tokens) ids of a published block
  std::vector<int32_t> lru_prev_, lru_next_;  // (num_blocks) the cached blocks, oldest first
  int32_t lru_head_ = -1, lru_tail_ = -1;
  std::vector<int32_t> empty_;         // stack of empty block ids (capacity num_blocks)
  std::unordered_map<uint64_t, int32_t> index_;  // key → published block
  KvPoolCounts counts_;
};

}  // namespace servedeck::worker
