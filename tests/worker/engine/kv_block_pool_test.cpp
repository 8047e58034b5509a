// The KV pool's bookkeeping: allocation and exhaustion, publish / acquire with exact matching
// (tokens and parent generation), LRU eviction order, duplicates and collisions; KvSequence's
// prefix attach, reserve and tail-first release.
#include <doctest/doctest.h>

#include <numeric>
#include <vector>

#include "worker/engine/kv_block_pool.hpp"
#include "worker/engine/kv_sequence.hpp"

using namespace servedeck::worker;

namespace {

std::vector<int32_t> ids(int32_t first, std::size_t n) {
  std::vector<int32_t> v(n);
  std::iota(v.begin(), v.end(), first);
  return v;
}

// Publishes a held block as the first block of a sequence and returns its key.
uint64_t publish_first(KvBlockPool& pool, int32_t block, const std::vector<int32_t>& tokens) {
  const uint64_t key = KvBlockPool::chain_key(KvBlockPool::k_first_key, tokens);
  REQUIRE(pool.publish(block, key, tokens, KvBlockRef{}).has_value());
  return key;
}

}  // namespace

TEST_CASE("blocks are handed out until none is left, and come back empty unless published") {
  KvBlockPool pool({3, 4});
  std::vector<int32_t> got;
  for (int i = 0; i < 3; ++i) got.push_back(pool.allocate().value());
  CHECK(got == std::vector<int32_t>{0, 1, 2});
  CHECK_FALSE(pool.allocate().has_value());
  CHECK(pool.counts().held == 3);
  pool.release(1);
  CHECK(pool.counts().empty == 1);
  CHECK(pool.allocate().value() == 1);
  CHECK_THROWS_AS(pool.release(7), std::out_of_range);
  pool.release(0);
  CHECK_THROWS_AS(pool.release(0), std::logic_error);  // not held any more
  CHECK_THROWS_AS(KvBlockPool({0, 4}), std::invalid_argument);
}

TEST_CASE("a published block is found by key only with the same tokens and parent") {
  KvBlockPool pool({4, 4});
  const auto a = ids(10, 4), b = ids(20, 4);
  const int32_t ba = pool.allocate().value();
  const uint64_t ka = publish_first(pool, ba, a);
  const int32_t bb = pool.allocate().value();
  const uint64_t kb = KvBlockPool::chain_key(ka, b);
  REQUIRE(pool.publish(bb, kb, b, pool.ref(ba)) == pool.ref(bb));
  pool.release(bb);
  pool.release(ba);
  CHECK(pool.counts().cached == 2);
  CHECK(pool.acquire(ka, a, KvBlockRef{}) == ba);
  CHECK(pool.counts().cached == 1);
  CHECK_FALSE(pool.acquire(kb, b, KvBlockRef{}).has_value());            // wrong parent
  CHECK_FALSE(pool.acquire(kb, ids(21, 4), pool.ref(ba)).has_value());   // wrong tokens
  CHECK_FALSE(pool.acquire(kb + 1, b, pool.ref(ba)).has_value());        // unknown key
  CHECK(pool.acquire(kb, b, pool.ref(ba)) == bb);
  CHECK(pool.acquire(kb, b, pool.ref(ba)) == bb);  // shared: two references
  pool.release(bb);
  CHECK(pool.counts().held == 2);
  pool.release(bb);
  pool.release(ba);
  CHECK(pool.counts().held == 0);
  CHECK(pool.counts().cached == 2);
}

TEST_CASE("the least recently used cached block is evicted first; a held one never") {
  KvBlockPool pool({3, 2});
  std::vector<int32_t> blocks;
  std::vector<uint64_t> keys;
  for (int32_t i = 0; i < 3; ++i) {
    blocks.push_back(pool.allocate().value());
    keys.push_back(publish_first(pool, blocks.back(), ids(100 * i, 2)));
  }
  for (int32_t b : blocks) pool.release(b);  // cached in the order 0, 1, 2
  CHECK(pool.acquire(keys[0], ids(0, 2), KvBlockRef{}) == blocks[0]);
  pool.release(blocks[0]);  // touched: now 1, 2, 0
  CHECK(pool.allocate().value() == blocks[1]);
  CHECK(pool.counts().evictions == 1);
  CHECK_FALSE(pool.acquire(keys[1], ids(100, 2), KvBlockRef{}).has_value());  // gone
  CHECK(pool.acquire(keys[2], ids(200, 2), KvBlockRef{}) == blocks[2]);        // held now
  CHECK(pool.allocate().value() == blocks[0]);
  CHECK_FALSE(pool.allocate().has_value());  // 2 is held: not evictable
  CHECK(pool.counts().evictions == 2);
}

TEST_CASE("a child whose parent was evicted and reused is a miss, even with the same key") {
  KvBlockPool pool({2, 2});
  const auto a = ids(1, 2), b = ids(5, 2);
  const int32_t pa = pool.allocate().value();
  const uint64_t ka = publish_first(pool, pa, a);
  const KvBlockRef old_parent = pool.ref(pa);
  const int32_t pb = pool.allocate().value();
  const uint64_t kb = KvBlockPool::chain_key(ka, b);
  REQUIRE(pool.publish(pb, kb, b, old_parent).has_value());
  pool.release(pa);  // parent first into the LRU order: evicted first
  pool.release(pb);
  CHECK(pool.allocate().value() == pa);  // evicts and reuses the parent's block
  const uint64_t ka2 = publish_first(pool, pa, a);  // the same tokens again, a new generation
  CHECK(ka2 == ka);
  CHECK_FALSE(pool.ref(pa) == old_parent);
  CHECK_FALSE(pool.acquire(kb, b, pool.ref(pa)).has_value());  // its K/V was computed after the old contents
}

TEST_CASE("publishing contents already indexed returns the indexed block; a colliding key indexes nothing") {
  KvBlockPool pool({3, 2});
  const auto a = ids(7, 2);
  const int32_t first = pool.allocate().value();
  const uint64_t key = publish_first(pool, first, a);
  const int32_t dup = pool.allocate().value();
  CHECK(pool.publish(dup, key, a, KvBlockRef{}) == pool.ref(first));
  const int32_t other = pool.allocate().value();
  CHECK_FALSE(pool.publish(other, key, ids(9, 2), KvBlockRef{}).has_value());  // same key, other tokens
  pool.release(dup);
  pool.release(other);
  CHECK(pool.counts().empty == 2);  // neither was indexed
  CHECK_THROWS_AS(pool.publish(dup, key, a, KvBlockRef{}), std::logic_error);  // not held
}

TEST_CASE("KvSequence: attach takes whole cached blocks up to the limit; reserve stops at an exhausted pool") {
  KvBlockPool pool({6, 4});
  const auto prompt = ids(0, 14);
  {
    KvSequence first(pool, true);
    REQUIRE(first.reserve(14));
    first.append(prompt);  // three full blocks published, the fourth partial
    CHECK(first.length() == 14);
    CHECK(first.room() == 16);
  }  // released: 3 cached, 3 empty (the partial block)
  CHECK(pool.counts().cached == 3);
  CHECK(pool.counts().empty == 3);
  KvSequence seq(pool, true);
  CHECK(seq.attach_prefix(prompt, 13) == 12);
  CHECK_THROWS_AS(seq.attach_prefix(prompt, 13), std::logic_error);  // not empty
  seq.release();
  CHECK(seq.attach_prefix(prompt, 11) == 8);  // rounded down to whole blocks
  seq.release();
  auto other = prompt;
  other[5] = 99;  // differs in the second block
  CHECK(seq.attach_prefix(other, 14) == 4);
  seq.release();
  KvSequence off(pool, false);
  CHECK(off.attach_prefix(prompt, 14) == 0);  // no caching: nothing found
  REQUIRE(off.reserve(24));                   // every block, evicting the 3 cached ones
  CHECK(pool.counts().evictions == 3);
  CHECK_FALSE(off.reserve(25));
  CHECK_THROWS_AS(off.append(ids(0, 25)), std::logic_error);  // past the reserved room
}

TEST_CASE("KvSequence releases its tail first, so a conversation's tail is evicted before its head") {
  KvBlockPool pool({4, 2});
  {
    KvSequence s(pool, true);
    REQUIRE(s.reserve(6));
    s.append(ids(0, 6));  // blocks 0, 1, 2 published
  }
  KvSequence t(pool, false);
  REQUIRE(t.reserve(4));  // the empty block 3, then the LRU oldest: the tail block 2
  KvSequence u(pool, true);
  CHECK(u.attach_prefix(ids(0, 6), 6) == 4);  // blocks 0 and 1 survived
}
