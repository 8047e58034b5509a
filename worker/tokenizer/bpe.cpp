#include "worker/tokenizer/bpe.hpp"

#include <bit>
#include <functional>
#include <limits>
#include <algorithm>

namespace servedeck::worker {

MergeTable::MergeTable(std::size_t n) {
  std::size_t cap = 16;
  while (cap < 2 * n) cap <<= 1;
  entries_.assign(cap, Entry{});
  mask_ = cap - 1;
  shift_ = 64 - static_cast<unsigned>(std::countr_zero(cap));
}

void MergeTable::insert_or_assign(std::int32_t a, std::int32_t b, Value v) {
  if (2 * (size_ + 1) > entries_.size()) {  // grow, keeping the load factor <= 0.5
    MergeTable bigger(2 * (size_ + 1));
    for (const Entry& e : entries_)
      if (e.key != k_empty)
        bigger.insert_or_assign(static_cast<std::int32_t>(e.key >> 32), static_cast<std::int32_t>(e.key & 0xFFFFFFFF), e.value);
    *this = std::move(bigger);
  }
  const std::uint64_t key = pack(a, b);
  for (std::size_t i = slot(key);; i = (i + 1) & mask_) {
    Entry& e = entries_[i];
    if (e.key == key) {
      e.value = v;
      return;
    }
    if (e.key == k_empty) {
      e.key = key;
      e.value = v;
      ++size_;
      return;
    }
  }
}

namespace {

constexpr std::size_t k_shards = 64;

}  // namespace

// Word cache: 64 shards, each a map from the word's 64-bit hash to (word, ids); the word is compared
// on a hit, so a hash collision only costs a miss (the colliding word is not cached).
struct BpeModel::Cache {
  struct Entry {
    std::string word;
    std::vector<std::int32_t> ids;
  };
  struct IdentityHash {
    std::size_t operator()(std::uint64_t h) const { return static_cast<std::size_t>(h); }
  };
  struct Shard {
    std::mutex mutex;
    std::unordered_map<std::uint64_t, Entry, IdentityHash> map;
    std::size_t bytes = 0;
  };
  std::array<Shard, k_shards> shards;
};

BpeModel::BpeModel(std::array<std::int32_t, 256> byte_ids, MergeTable merges,
                   const std::unordered_map<std::string, std::int32_t>* vocab, bool ignore_merges)
    : byte_ids_(byte_ids), merges_(std::move(merges)), vocab_(vocab), ignore_merges_(ignore_merges),
      cache_(std::make_unique<Cache>()) {}

BpeModel::~BpeModel() = default;

void BpeModel::encode_word(std::string_view word, std::vector<std::int32_t>& out) const {
  if (word.size() == 1) {
    out.push_back(byte_ids_[static_cast<unsigned char>(word[0])]);
    return;
  }
  if (word.size() > k_max_cached_word_bytes) {
    merge_word(word, out);
    return;
  }
  const std::uint64_t h = std::hash<std::string_view>{}(word);
  Cache::Shard& shard = cache_->shards[(h >> 58) % k_shards];
  {
    std::lock_guard lock(shard.mutex);
    const auto it = shard.map.find(h);
    if (it != shard.map.end() && it->second.word == word) {
      out.insert(out.end(), it->second.ids.begin(), it->second.ids.end());
      return;
    }
  }
  const std::size_t first = out.size();
  merge_word(word, out);
  std::vector<std::int32_t> ids(out.begin() + static_cast<std::ptrdiff_t>(first), out.end());
  const std::size_t cost = word.size() + 4 * ids.size() + 64;
  std::lock_guard lock(shard.mutex);
  // note: clearing a full shard (rather than LRU) keeps the hit path short; 64 MiB of words covers
  // the working set of source code and prose (the JS reference caches 10,000 words).
  if (shard.bytes + cost > k_cache_shard_bytes) {
    shard.map.clear();
    shard.bytes = 0;
  }
  if (shard.map.try_emplace(h, Cache::Entry{std::string(word), std::move(ids)}).second) shard.bytes += cost;
}

void BpeModel::merge_word(std::string_view word, std::vector<std::int32_t>& out) const {
  if (ignore_merges_ && vocab_ != nullptr) {
    const auto it = vocab_->find(std::string(word));
    if (it != vocab_->end()) {
      out.push_back(it->second);
      return;
    }
  }
  if (word.size() <= k_short_word_bytes) {
    merge_word_short(word, out);
  } else {
    merge_word_heap(word, out);
  }
}

void BpeModel::merge_word_short(std::string_view word, std::vector<std::int32_t>& out) const {
  constexpr std::int32_t k_none = std::numeric_limits<std::int32_t>::max();
  // Symbols and the rank of the pair (i, i+1), on the stack: words here are <= k_short_word_bytes.
  std::int32_t ids[k_short_word_bytes];
  std::int32_t ranks[k_short_word_bytes];
  std::int32_t merged[k_short_word_bytes];
  std::size_t n = std::min(word.size(), k_short_word_bytes);
  for (std::size_t i = 0; i < n; ++i) ids[i] = byte_ids_[static_cast<unsigned char>(word[i])];
  auto rank_pair = [&](std::size_t i) {
    const MergeTable::Value* v = merges_.find(ids[i], ids[i + 1]);
    ranks[i] = v ? v->rank : k_none;
    merged[i] = v ? v->merged : -1;
  };
  for (std::size_t i = 0; i + 1 < n; ++i) rank_pair(i);
  while (n > 1) {
    std::size_t best = 0;
    std::int32_t best_rank = k_none;
    for (std::size_t i = 0; i + 1 < n; ++i) {
      if (ranks[i] < best_rank) {
        best_rank = ranks[i];
        best = i;
      }
    }
    if (best_rank == k_none) break;
    ids[best] = merged[best];
    for (std::size_t i = best + 1; i + 1 < n; ++i) {
      ids[i] = ids[i + 1];
      ranks[i] = ranks[i + 1];
      merged[i] = merged[i + 1];
    }
    --n;
    if (best > 0) rank_pair(best - 1);
    if (best + 1 < n) rank_pair(best);
  }
  out.insert(out.end(), ids, ids + n);
}

void BpeModel::merge_word_heap(std::string_view word, std::vector<std::int32_t>& out) const {
  struct Symbol {
    std::int32_t id;
    std::int32_t prev;
    std::int32_t next;
    bool alive;
  };
  struct Candidate {
    std::int32_t rank;
    std::int32_t pos;  // index of the left symbol (its original position: ties go leftmost)
    std::int32_t merged;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  const auto n = static_cast<std::int32_t>(word.size());
  thread_local std::vector<Symbol> sym;
  thread_local std::vector<Candidate> storage;
  sym.resize(word.size());
  for (std::int32_t i = 0; i < n; ++i)
    sym[static_cast<std::size_t>(i)] = {byte_ids_[static_cast<unsigned char>(word[static_cast<std::size_t>(i)])],
                                        i - 1, i + 1 < n ? i + 1 : -1, true};
  // A binary min-heap on the reused per-thread vector (std::priority_queue would own a new one).
  storage.clear();
  auto push = [&](Candidate c) {
    storage.push_back(c);
    std::push_heap(storage.begin(), storage.end(), std::greater<>{});
  };
  auto push_pair = [&](std::int32_t left) {
    if (left < 0) return;
    const std::int32_t right = sym[static_cast<std::size_t>(left)].next;
    if (right < 0) return;
    const MergeTable::Value* v = merges_.find(sym[static_cast<std::size_t>(left)].id, sym[static_cast<std::size_t>(right)].id);
    if (v) push({v->rank, left, v->merged});
  };
  for (std::int32_t i = 0; i + 1 < n; ++i) push_pair(i);
  while (!storage.empty()) {
    std::pop_heap(storage.begin(), storage.end(), std::greater<>{});
    const Candidate top = storage.back();
    storage.pop_back();
    Symbol& left = sym[static_cast<std::size_t>(top.pos)];
    if (!left.alive || left.next < 0) continue;
    Symbol& right = sym[static_cast<std::size_t>(left.next)];
    const MergeTable::Value* v = merges_.find(left.id, right.id);
    if (v == nullptr || v->rank != top.rank || v->merged != top.merged) continue;  // stale entry
    left.id = top.merged;
    right.alive = false;
    left.next = right.next;
    if (left.next >= 0) sym[static_cast<std::size_t>(left.next)].prev = top.pos;
    push_pair(left.prev);
    push_pair(top.pos);
  }
  for (std::int32_t i = 0; i >= 0; i = sym[static_cast<std::size_t>(i)].next) out.push_back(sym[static_cast<std::size_t>(i)].id);
}

}  // namespace servedeck::worker
