// The BPE model of a byte-level tokenizer: merge ranks keyed by the pair of token ids, the merge
// loop over one pre-tokenized word, and a word -> ids cache.
//
// Words are raw bytes (not the byte-level alphabet): the initial symbols are the single-byte tokens,
// merges follow the rank order of tokenizer.json `model.merges` (lowest rank first, leftmost first
// among equal ranks — the order Hugging Face tokenizers' BPE::merge_word and transformers.js use).
//
// Thread-safety: immutable after construction except the cache, which is sharded and guarded by
// per-shard mutexes; encode_word() may run concurrently.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace servedeck::worker {

/// Open-addressing hash map (linear probing) from a pair of token ids to (rank, merged id).
/// note: a flat table keeps a lookup to ~1 cache miss; std::unordered_map costs 2-3 (node chasing).
class MergeTable {
 public:
  struct Value {
    std::int32_t rank;
    std::int32_t merged;
  };
  /// Sizes the table for `n` entries (load factor <= 0.5).
  explicit MergeTable(std::size_t n = 0);
  /// Inserts or overwrites (a later duplicate merge wins, as in the reference's HashMap build).
  void insert_or_assign(std::int32_t a, std::int32_t b, Value v);
  /// The merge of (a, b), or nullptr.
  const Value* find(std::int32_t a, std::int32_t b) const {
    const std::uint64_t key = pack(a, b);
    for (std::size_t i = slot(key);; i = (i + 1) & mask_) {
      const Entry& e = entries_[i];
      if (e.key == key) return &e.value;
      if (e.key == k_empty) return nullptr;
    }
  }
  std::size_t size() const { return size_; }

 private:
  static constexpr std::uint64_t k_empty = ~std::uint64_t{0};
  struct Entry {
    std::uint64_t key = k_empty;
    Value value{};
  };
  static std::uint64_t pack(std::int32_t a, std::int32_t b) {
    return (static_cast<std::uint64_t>(static_cast<std::uint32_t>(a)) << 32) | static_cast<std::uint32_t>(b);
  }
  std::size_t slot(std::uint64_t key) const { return static_cast<std::size_t>((key * 0x9E3779B97F4A7C15ULL) >> shift_); }
  std::vector<Entry> entries_;
  std::size_t mask_ = 0;
  unsigned shift_ = 64;
  std::size_t size_ = 0;
};

class BpeModel {
 public:
  /// `byte_ids[b]`: id of the single-byte token for byte b (all 256 must exist).
  /// `vocab`: token bytes -> id (for ignore_merges). `merges`: the rank table.
  BpeModel(std::array<std::int32_t, 256> byte_ids, MergeTable merges,
           const std::unordered_map<std::string, std::int32_t>* vocab, bool ignore_merges);
  ~BpeModel();

  /// Appends the ids of one word (raw bytes, non-empty) to `out`, through the cache.
  void encode_word(std::string_view word, std::vector<std::int32_t>& out) const;

  /// The merge loop without the cache; picks the short-word or the heap algorithm by length.
  void merge_word(std::string_view word, std::vector<std::int32_t>& out) const;

  /// The two algorithms, exposed so tests can check they agree.
  void merge_word_short(std::string_view word, std::vector<std::int32_t>& out) const;
  void merge_word_heap(std::string_view word, std::vector<std::int32_t>& out) const;

  /// Words up to this many bytes are cached.
  /// note: long whitespace runs (indentation, padding) are frequent in code and cost ~50 us each
  /// through the heap algorithm at 300 bytes; caching them is what makes repeats cheap.
  static constexpr std::size_t k_max_cached_word_bytes = 2048;
  /// Bytes (word bytes + 4 per id + 64 overhead) one of the 64 cache shards may hold before it is
  /// cleared: 1 MiB, so at most 64 MiB per tokenizer.
  static constexpr std::size_t k_cache_shard_bytes = std::size_t{1} << 20;
  /// Words longer than this use the O(n log n) heap algorithm, shorter ones the O(n^2) scan.
  static constexpr std::size_t k_short_word_bytes = 48;

 private:
  struct Cache;
  std::array<std::int32_t, 256> byte_ids_;
  MergeTable merges_;
  const std::unordered_map<std::string, std::int32_t>* vocab_;
  bool ignore_merges_;
  std::unique_ptr<Cache> cache_;
};

}  // namespace servedeck::worker
