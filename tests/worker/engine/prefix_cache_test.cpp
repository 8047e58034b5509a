// The engine's KV pool with the FakeBackend (whose logits depend on the context it reads back
// through the block table): prefix reuse across requests and turns, several conversations at
// once, LRU eviction under pressure, prompt_logprobs recomputing, chunked prefill positions,
// cancellation between prefill chunks, the pool allocated once, and prefix caching turned off.
#include <doctest/doctest.h>

#include <chrono>
#include <future>
#include <thread>

#include "tests/worker/engine/fake_backend.hpp"
#include "worker/engine/engine.hpp"

using namespace servedeck::worker;
using namespace servedeck::worker::testing;

namespace {

struct Outcome {
  GenerationResult result;
  std::vector<int32_t> tokens;
};

Outcome run(Engine& engine, GenerationRequest req) {
  auto tokens = std::make_shared<std::vector<int32_t>>();
  std::promise<GenerationResult> done;
  auto fut = done.get_future();
  engine.submit(
      std::move(req), [tokens](const GenerationEvent& e) { tokens->push_back(e.token); },
      [&done](const GenerationResult& r) { done.set_value(r); });
  REQUIRE(fut.wait_for(std::chrono::seconds(20)) == std::future_status::ready);
  return Outcome{fut.get(), *tokens};
}

GenerationRequest greedy(std::vector<int32_t> prompt, std::size_t max_tokens = 4) {
  GenerationRequest r;
  r.prompt = std::move(prompt);
  r.max_tokens = max_tokens;
  r.sampling.temperature = 0;
  r.ignore_eos = true;
  return r;
}

EngineOptions options(std::size_t tokens, std::size_t chunk = 4096) {
  EngineOptions o;
  o.kv_cache_bytes = tokens * 256;  // FakeBackend: 256 bytes per token
  o.max_model_len = 4096;
  o.prefill_chunk = chunk;
  return o;
}

std::vector<int32_t> text(std::size_t n, int32_t seed) {
  std::vector<int32_t> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<int32_t>((static_cast<std::size_t>(seed) * 31 + i * 7) % 250);
  return v;
}

std::vector<int32_t> concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

}  // namespace

TEST_CASE("a repeated prompt reuses its full blocks and prefills only the rest, with the same tokens") {
  FakeVocab vocab;
  FakeBackend backend;
  Engine engine(backend, vocab, options(1024));
  const auto prompt = text(50, 1);  // 3 full blocks of 16 + 2
  const auto cold = run(engine, greedy(prompt));
  CHECK(cold.result.cached_tokens == 0);
  backend.clear_passes();
  const auto warm = run(engine, greedy(prompt));
  CHECK(warm.result.cached_tokens == 48);
  CHECK(warm.tokens == cold.tokens);
  REQUIRE(!backend.passes().empty());
  CHECK(backend.passes()[0] == std::pair<std::size_t, std::size_t>{48, 2});  // the prefill starts after the cache
  const auto s = engine.stats();
  CHECK(s.prefix_cache_hit_tokens == 48);
  CHECK(s.prefix_cache_miss_tokens == 50 + 2);
  CHECK(s.kv_pool_allocations == 1);
  CHECK(backend.pool_allocations == 1);
}

TEST_CASE("a prompt of whole cached blocks still runs its last token") {
  FakeVocab vocab;
  FakeBackend backend;
  Engine engine(backend, vocab, options(1024));
  const auto prompt = text(48, 2);
  const auto cold = run(engine, greedy(prompt, 1));  // stores 48 positions: 3 full blocks
  backend.clear_passes();
  const auto warm = run(engine, greedy(prompt, 1));
  CHECK(warm.result.cached_tokens == 32);  // the third block holds the last token: not taken
  CHECK(backend.passes()[0] == std::pair<std::size_t, std::size_t>{32, 16});
  CHECK(warm.tokens == cold.tokens);
}

TEST_CASE("a growing conversation reuses more each turn, including the generated tokens") {
  FakeVocab vocab;
  FakeBackend backend;
  Engine engine(backend, vocab, options(2048));
  std::vector<int32_t> conv = text(40, 3);
  std::size_t stored = 0;
  for (int turn = 0; turn < 5; ++turn) {
    CAPTURE(turn);
    const auto out = run(engine, greedy(conv, 8));
    CHECK(out.result.cached_tokens == stored / 16 * 16);
    // The same turn on a fresh engine (nothing cached) samples the same tokens.
    FakeBackend fresh_backend;
    Engine fresh(fresh_backend, vocab, options(2048));
    CHECK(run(fresh, greedy(conv, 8)).tokens == out.tokens);
    stored = conv.size() + out.tokens.size() - 1;  // the last sampled token is never run
    conv = concat(concat(conv, out.tokens), text(30, turn + 10));
  }
  CHECK(engine.stats().kv_pool_allocations == 1);
}

TEST_CASE("several conversations keep their prefixes at once; under pressure the least recently used is evicted") {
  FakeVocab vocab;
  FakeBackend backend;
  Engine engine(backend, vocab, options(16 * 12));  // 12 blocks
  const auto agent = text(70, 4), sub = text(70, 5), title = text(40, 6);
  const auto agent0 = run(engine, greedy(agent, 2));  // stores 71 positions: 4 full blocks cached
  const auto sub0 = run(engine, greedy(sub, 2));      // 4 more; 4 blocks empty
  const auto agent1 = run(engine, greedy(agent, 2));
  CHECK(agent1.result.cached_tokens == 64);
  CHECK(agent1.tokens == agent0.tokens);
  const auto sub1 = run(engine, greedy(sub, 2));
  CHECK(sub1.result.cached_tokens == 64);
  CHECK(sub1.tokens == sub0.tokens);
  run(engine, greedy(title, 2));  // 3 of the 4 empty blocks; 2 stay cached
  CHECK(run(engine, greedy(title, 2)).result.cached_tokens == 32);
  CHECK(engine.stats().kv_blocks.evictions == 0);
  CHECK(engine.stats().kv_blocks.cached == 10);
  // 10 blocks for a 144-token prompt: the 2 empty ones and 8 evicted, least recently used first:
  // agent's and sub's (each conversation's tail before its head), not the title's.
  const auto big = text(16 * 9, 7);
  run(engine, greedy(big, 2));
  CHECK(engine.stats().kv_blocks.evictions == 8);
  CHECK(run(engine, greedy(title, 2)).result.cached_tokens == 32);
  const auto agent2 = run(engine, greedy(agent, 2));
  CHECK(agent2.result.cached_tokens == 0);
  CHECK(agent2.tokens == agent0.tokens);
  CHECK(engine.stats().kv_blocks.held == 0);
}

TEST_CASE("prompt_logprobs recompute the cached part and match a cold run") {
  FakeVocab vocab;
  FakeBackend backend;
  Engine engine(backend, vocab, options(1024, 20));
  const auto prompt = text(45, 8);
  run(engine, greedy(prompt));
  auto req = greedy(prompt);
  req.prompt_logprobs = 2;
  backend.clear_passes();
  const auto warm = run(engine, req);
  CHECK(warm.result.cached_tokens == 0);
  CHECK(backend.passes()[0].first == 0);
  FakeBackend cold_backend;
  Engine cold(cold_backend, vocab, options(1024, 45));  // one chunk
  const auto ref = run(cold, req);
  REQUIRE(warm.result.prompt_logprobs.size() == prompt.size());
  REQUIRE(ref.result.prompt_logprobs.size() == prompt.size());
  CHECK(!warm.result.prompt_logprobs[0].has_value());
  for (std::size_t i = 1; i < prompt.size(); ++i) {
    CAPTURE(i);
    REQUIRE(warm.result.prompt_logprobs[i].has_value());
    CHECK(warm.result.prompt_logprobs[i]->id == prompt[i]);
    CHECK(warm.result.prompt_logprobs[i]->logprob == doctest::Approx(ref.result.prompt_logprobs[i]->logprob).epsilon(1e-6));
    CHECK(warm.result.prompt_logprobs[i]->top == ref.result.prompt_logprobs[i]->top);
  }
  CHECK(warm.tokens == ref.tokens);
}

TEST_CASE("prefill runs in chunks of prefill_chunk from the cached length; the chunked tokens equal one pass's") {
  FakeVocab vocab;
  FakeBackend backend;
  Engine engine(backend, vocab, options(1024, 10));
  const auto prompt = text(35, 9);
  const auto out = run(engine, greedy(prompt, 3));
  const auto passes = backend.passes();
  REQUIRE(passes.size() == 4 + 2);  // 10 + 10 + 10 + 5, then two decode steps
  CHECK(passes[0] == std::pair<std::size_t, std::size_t>{0, 10});
  CHECK(passes[3] == std::pair<std::size_t, std::size_t>{30, 5});
  CHECK(passes[4] == std::pair<std::size_t, std::size_t>{35, 1});
  backend.clear_passes();
  const auto again = run(engine, greedy(concat(prompt, text(12, 10)), 3));
  CHECK(again.result.cached_tokens == 32);
  CHECK(backend.passes()[0] == std::pair<std::size_t, std::size_t>{32, 10});
  CHECK(backend.passes()[1] == std::pair<std::size_t, std::size_t>{42, 5});
  FakeBackend one_pass;
  Engine whole(one_pass, vocab, options(1024));
  CHECK(run(whole, greedy(prompt, 3)).tokens == out.tokens);
}

TEST_CASE("a cancelled request stops between prefill chunks; its finished blocks stay cached") {
  FakeVocab vocab;
  FakeBackend backend;
  backend.delay_ms = 20;
  Engine engine(backend, vocab, options(4096, 64));
  const auto prompt = text(64 * 20, 11);  // 20 chunks
  std::promise<GenerationResult> done;
  auto fut = done.get_future();
  auto handle = engine.submit(greedy(prompt), nullptr, [&](const GenerationResult& r) { done.set_value(r); });
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (backend.forward_calls < 2 && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
  REQUIRE(backend.forward_calls >= 2);
  handle->cancel();
  REQUIRE(fut.wait_for(std::chrono::seconds(10)) == std::future_status::ready);
  const auto r = fut.get();
  CHECK(r.finish == FinishReason::cancelled);
  CHECK(r.completion_tokens == 0);
  const std::size_t ran = backend.forward_calls;
  CHECK(ran < 20);
  CHECK(engine.stats().kv_blocks.held == 0);
  // The retry (the client reconnecting) starts where the cancelled prefill got to.
  backend.delay_ms = 0;
  const auto retry = run(engine, greedy(prompt, 1));
  CHECK(retry.result.cached_tokens == ran * 64);
}

TEST_CASE("the engine refuses a pool without a whole block, and a chunk of 0") {
  FakeVocab vocab;
  FakeBackend backend;
  auto o = options(1);
  o.kv_cache_bytes = 15 * 256;
  CHECK_THROWS_WITH_AS(Engine(backend, vocab, o),
                       "--kv-cache-bytes 3840 holds no KV block: a block is 16 tokens x 256 bytes per token = 4096 bytes",
                       std::invalid_argument);
  auto c = options(64);
  c.prefill_chunk = 0;
  CHECK_THROWS_AS(Engine(backend, vocab, c), std::invalid_argument);
}

TEST_CASE("prefix_caching off: every request prefills its whole prompt, nothing is published, the same tokens") {
  FakeVocab vocab;
  FakeBackend backend;
  auto o = options(256, 16);
  o.prefix_caching = false;
  Engine engine(backend, vocab, o);
  const auto prompt = text(40, 12);
  const auto a = run(engine, greedy(prompt));
  backend.clear_passes();
  const auto b = run(engine, greedy(prompt));
  CHECK(a.result.cached_tokens == 0);
  CHECK(b.result.cached_tokens == 0);
  REQUIRE(!backend.passes().empty());
  CHECK(backend.passes()[0] == std::pair<std::size_t, std::size_t>{0, 16});  // from position 0 again
  CHECK(a.tokens == b.tokens);
  CHECK(engine.stats().prefix_cache_hit_tokens == 0);
  CHECK(engine.stats().kv_blocks.cached == 0);  // nothing published
  FakeBackend reused;
  Engine reference(reused, vocab, options(256, 16));
  (void)run(reference, greedy(prompt));
  const auto c = run(reference, greedy(prompt));
  CHECK(c.result.cached_tokens == 32);
  CHECK(c.tokens == a.tokens);
}
