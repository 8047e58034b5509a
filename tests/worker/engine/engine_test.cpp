// The scheduler with a FakeBackend: greedy and seeded generation, logit_bias and penalties, stop strings across token
// boundaries, EOS, max_tokens, logprobs and prompt_logprobs, thinking_token_budget forcing,
// the KV cap refusal message, cancellation freeing the cache, FIFO order.
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <future>
#include <map>
#include <mutex>
#include <thread>

#include "tests/worker/engine/fake_backend.hpp"
#include "worker/engine/engine.hpp"

using namespace servedeck::worker;
using namespace servedeck::worker::testing;

namespace {

struct Collected {
  std::mutex m;
  std::string text;
  std::vector<int32_t> tokens;
  std::vector<GenerationEvent> events;
  std::promise<GenerationResult> done;
};

GenerationResult run(Engine& engine, GenerationRequest req, Collected& c) {
  auto fut = c.done.get_future();
  engine.submit(
      std::move(req),
      [&c](const GenerationEvent& e) {
        std::lock_guard lock(c.m);
        c.text += e.text;
        c.tokens.push_back(e.token);
        c.events.push_back(e);
      },
      [&c](const GenerationResult& r) { c.done.set_value(r); });
  REQUIRE(fut.wait_for(std::chrono::seconds(20)) == std::future_status::ready);
  return fut.get();
}

EngineOptions options(std::size_t kv_bytes = 1 << 20) {
  EngineOptions o;
  o.kv_cache_bytes = kv_bytes;
  o.max_model_len = 4096;
  o.eos_ids = {k_eos};
  o.think_start_id = k_think;
  o.think_end_id = k_think_end;
  return o;
}

std::vector<int32_t> chat_prompt(FakeVocab& v, std::string_view user) {
  std::vector<int32_t> p = {k_im_start};
  auto u = v.encode(std::string("user ") + std::string(user));
  p.insert(p.end(), u.begin(), u.end());
  p.push_back(k_eos);
  p.push_back(k_im_start);
  auto a = v.encode("assistant\n");
  p.insert(p.end(), a.begin(), a.end());
  return p;
}

GenerationRequest greedy(std::vector<int32_t> prompt, std::size_t max_tokens) {
  GenerationRequest r;
  r.prompt = std::move(prompt);
  r.max_tokens = max_tokens;
  r.sampling.temperature = 0;
  return r;
}

}  // namespace

TEST_CASE("greedy generation follows the logits and stops at EOS without emitting it") {
  FakeVocab vocab;
  FakeBackend backend(scripted_answer(vocab.encode("Hi there")));
  Engine engine(backend, vocab, options());
  Collected c;
  const auto r = run(engine, greedy(chat_prompt(vocab, "hello"), 100), c);
  CHECK(r.finish == FinishReason::stop);
  CHECK(c.text == "Hi there");
  REQUIRE(r.stop_token.has_value());
  CHECK(*r.stop_token == k_eos);
  CHECK(r.completion_tokens == 9);  // 8 bytes + EOS
  CHECK(r.prompt_tokens == chat_prompt(vocab, "hello").size());
  CHECK(engine.stats().kv_blocks.held == 0);
}

// Greedy decoding without logprobs needs only the pick: the engine asks the backend for it
// (Backend::forward_greedy, which the CUDA backend makes on its device) instead of the row. With
// logprobs, or when sampling, it still takes the row.
TEST_CASE("greedy decoding without logprobs takes the backend's pick; logprobs and sampling take the row") {
  FakeVocab vocab;
  FakeBackend backend(scripted_answer(vocab.encode("Hi there")));
  Engine engine(backend, vocab, options());
  const auto prompt = chat_prompt(vocab, "hello");
  Collected a;
  auto r = run(engine, greedy(prompt, 100), a);
  CHECK(a.text == "Hi there");
  CHECK(r.completion_tokens == 9);
  CHECK(backend.greedy_calls == 8);  // every token after the prefill's
  backend.greedy_calls = 0;
  GenerationRequest top1 = greedy(prompt, 100);
  top1.sampling = SamplingParams{0.9, 1, 1.0, 3};  // top_k 1 is greedy too
  Collected b;
  run(engine, top1, b);
  CHECK(b.text == "Hi there");
  CHECK(backend.greedy_calls == 8);
  backend.greedy_calls = 0;
  GenerationRequest lp = greedy(prompt, 100);
  lp.logprobs = 0;  // the token's own logprob only: still the row
  Collected c;
  run(engine, lp, c);
  CHECK(c.text == "Hi there");
  CHECK(backend.greedy_calls == 0);
  REQUIRE(c.events.size() == 9);
  for (const auto& e : c.events) CHECK(e.logprob.has_value());
  GenerationRequest sampled = greedy(prompt, 5);
  sampled.sampling = SamplingParams{0.9, 50, 0.9, 11};
  Collected d;
  run(engine, sampled, d);
  CHECK(backend.greedy_calls == 0);
  CHECK(engine.stats().kv_blocks.held == 0);
}

// logit_bias and the penalties change the row the sampler reads (worker/engine/logits_adjust.hpp),
// so greedy decoding with them takes the row, not the backend's pick; the logprobs stay the raw
// row's (vLLM's default).
TEST_CASE("logit_bias steers greedy decoding; the logprobs stay the raw row's") {
  FakeVocab vocab;
  FakeBackend backend(scripted_answer(vocab.encode("Hi there")));
  Engine engine(backend, vocab, options());
  const auto prompt = chat_prompt(vocab, "hello");
  GenerationRequest banned = greedy(prompt, 4);
  banned.logprobs = 0;
  banned.adjust.bias = {{'H', -100.0f}, {'Z', 50.0f}};  // the scripted peak is 20, the hash below 4
  Collected b;
  const auto rb = run(engine, banned, b);
  CHECK(rb.finish == FinishReason::length);
  CHECK(b.text == "ZZZZ");
  REQUIRE(b.events.size() == 4);
  // The first token's logprob is the raw row's: 'Z' under the scripted peak on 'H' (20 against [0, 4)).
  REQUIRE(b.events[0].logprob.has_value());
  CHECK(b.events[0].logprob->logprob < -15.0f);
  CHECK(b.events[0].logprob->rank > 1);
  CHECK(engine.stats().kv_blocks.held == 0);
}

// Every step's token is the argmax of the backend's row for that context, adjusted by an
// implementation of the formulas in worker/engine/logits_adjust.hpp written here, in the same
// float operations: bias, repetition over prompt + output, frequency and presence over output.
TEST_CASE("greedy decoding with logit_bias and all three penalties takes the adjusted row's argmax at every step, not the backend's pick") {
  FakeVocab vocab;
  FakeBackend backend;  // hash logits in [0, 4): close calls everywhere, so every change matters
  Engine engine(backend, vocab, options());
  const auto prompt = chat_prompt(vocab, "hello hello, abc");
  GenerationRequest req = greedy(prompt, 40);
  req.ignore_eos = true;
  req.adjust.bias = {{'a', 2.0f}, {'b', 1.5f}, {'l', 1.0f}, {'c', -1.0f}};
  req.adjust.repetition_penalty = 0.6f;  // below 1: the prompt's and the output's tokens are favoured,
  req.adjust.frequency_penalty = 1.0f;   // and the penalties push repeats back down
  req.adjust.presence_penalty = 0.5f;
  Collected c;
  const auto r = run(engine, req, c);
  CHECK(r.finish == FinishReason::length);
  CHECK(backend.greedy_calls == 0);
  REQUIRE(c.tokens.size() == 40);

  std::vector<int32_t> ctx = prompt;
  std::map<int32_t, uint32_t> count;
  std::size_t differs_from_raw = 0;
  for (std::size_t step = 0; step < c.tokens.size(); ++step) {
    CAPTURE(step);
    std::vector<float> row = backend.logits_for(ctx);
    const auto raw_best = std::max_element(row.begin(), row.end()) - row.begin();
    for (const auto& [id, b] : req.adjust.bias) row[static_cast<std::size_t>(id)] += b;
    std::vector<bool> seen(row.size(), false);
    for (const int32_t t : prompt) seen[static_cast<std::size_t>(t)] = true;
    for (const auto& [t, n] : count) seen[static_cast<std::size_t>(t)] = true;
    for (std::size_t j = 0; j < row.size(); ++j)
      if (seen[j]) row[j] = row[j] > 0.0f ? row[j] / 0.6f : row[j] * 0.6f;
    for (const auto& [t, n] : count) row[static_cast<std::size_t>(t)] -= static_cast<float>(n) * 1.0f + 0.5f;
    const auto best = static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin());  // lowest id on ties
    CHECK(c.tokens[step] == best);
    if (best != raw_best) ++differs_from_raw;
    ctx.push_back(c.tokens[step]);
    ++count[c.tokens[step]];
  }
  CAPTURE(differs_from_raw);
  CHECK(differs_from_raw >= 10);  // the changes decided many of the steps, not a few
  CHECK(engine.stats().kv_blocks.held == 0);
}

TEST_CASE("a logit_bias id outside the backend's row is refused by Engine::check and by the scheduler") {
  FakeVocab vocab;
  FakeBackend backend;
  Engine engine(backend, vocab, options());
  LogitsAdjust ok;
  ok.bias = {{0, 1.0f}, {static_cast<int32_t>(k_fake_vocab) - 1, 1.0f}};
  CHECK_FALSE(engine.check(ok).has_value());
  LogitsAdjust bad;
  bad.bias = {{5, 1.0f}, {static_cast<int32_t>(k_fake_vocab), 1.0f}};
  const auto e = engine.check(bad);
  REQUIRE(e.has_value());
  CHECK(*e == "field 'logit_bias': token id 263 is outside the vocabulary (263 logits: ids 0..262)");
  GenerationRequest req = greedy(chat_prompt(vocab, "hi"), 4);
  req.adjust = bad;
  Collected c;
  const auto r = run(engine, req, c);  // submitted without the route's check: finishes with the error
  CHECK(r.finish == FinishReason::error);
  CHECK(r.error == *e);
  CHECK(c.tokens.empty());
}

// Top-k sampling needs only the k best logits and the argmax (Sampler::sample_top): the engine
// asks the backend for them (Backend::forward_top_k, selected on the CUDA backend's device), and
// the tokens are those of the row path, draw for draw.
TEST_CASE("top-k sampling takes the backend's selection, with the row path's tokens; logprobs or top_k 0 take the row") {
  FakeVocab vocab;
  FakeBackend backend;
  Engine engine(backend, vocab, options());
  const auto prompt = chat_prompt(vocab, "hello");
  GenerationRequest sel = greedy(prompt, 24);
  sel.ignore_eos = true;
  sel.sampling = SamplingParams{0.9, 20, 0.95, 77};
  Collected a;
  run(engine, sel, a);
  CHECK(backend.top_k_calls == 23);  // every token after the prefill's
  CHECK(backend.greedy_calls == 0);
  backend.top_k_calls = 0;
  GenerationRequest row = sel;
  row.logprobs = 0;  // the row is needed: no selection
  Collected b;
  run(engine, row, b);
  CHECK(backend.top_k_calls == 0);
  CHECK(a.tokens == b.tokens);
  GenerationRequest all = sel;
  all.sampling.top_k = 0;  // no top_k: the row
  Collected c;
  run(engine, all, c);
  CHECK(backend.top_k_calls == 0);
  CHECK(c.tokens.size() == 24);
  CHECK(engine.stats().kv_blocks.held == 0);
}

TEST_CASE("a backend's greedy pick outside the vocabulary ends the request with an error naming it") {
  for (const int32_t bad : {static_cast<int32_t>(k_fake_vocab) + 5, static_cast<int32_t>(k_fake_vocab), -1}) {
    CAPTURE(bad);
    FakeVocab vocab;
    FakeBackend backend(scripted_answer(vocab.encode("Hi there")));
    backend.bad_pick = bad;
    Engine engine(backend, vocab, options());
    Collected c;
    const auto r = run(engine, greedy(chat_prompt(vocab, "hello"), 100), c);
    CHECK(r.finish == FinishReason::error);
    CHECK(r.error == "backend picked token " + std::to_string(bad) + " outside the vocabulary of " + std::to_string(k_fake_vocab));
    CHECK(c.text == "H");  // the prefill's token was delivered; nothing after the bad pick
    CHECK(engine.stats().kv_blocks.held == 0);
  }
}

// The default forward_greedy (the CPU backend's) refuses a short row instead of picking from it.
TEST_CASE("Backend::forward_greedy's default throws on a row shorter than the vocabulary") {
  struct ShortRow final : Backend {
    std::size_t vocab_size() const override { return 8; }
    std::size_t kv_bytes_per_token() const override { return 1; }
    std::string name() const override { return "short"; }
    void allocate_kv_pool(const KvPoolShape&) override {}
    std::size_t kv_pool_allocations() const override { return 0; }
    std::vector<float> forward(const KvView&, std::span<const int32_t>, bool) override { return std::vector<float>(5, 1.f); }
  } backend;
  const int32_t blocks[1] = {0};
  CHECK_THROWS_WITH_AS(backend.forward_greedy(KvView{blocks, 0}, 1), "backend returned 5 logits for one token; expected 8",
                       std::runtime_error);
}

TEST_CASE("max_tokens ends with length; seeded sampling reproduces") {
  FakeVocab vocab;
  FakeBackend backend;
  Engine engine(backend, vocab, options());
  auto sampled = [&](uint64_t seed) {
    GenerationRequest r = greedy(chat_prompt(vocab, "x"), 12);
    r.sampling = SamplingParams{0.9, 50, 0.9, seed};
    r.ignore_eos = true;
    Collected c;
    const auto res = run(engine, r, c);
    CHECK(res.finish == FinishReason::length);
    CHECK(res.completion_tokens == 12);
    return c.tokens;
  };
  const auto a = sampled(7), b = sampled(7), d = sampled(8);
  CHECK(a.size() == 12);
  CHECK(a == b);
  CHECK(a != d);
}

TEST_CASE("a stop string spanning token boundaries is not emitted") {
  FakeVocab vocab;
  // Tokens "He" + "llo ST" + "OP!": the stop string "STOP" spans the last two.
  FakeBackend backend(scripted_answer({k_piece_he, k_piece_llo_st, k_piece_op, 'x', 'y'}));
  Engine engine(backend, vocab, options());
  GenerationRequest req = greedy(chat_prompt(vocab, "q"), 50);
  req.stop = {"STOP"};
  Collected c;
  const auto r = run(engine, req, c);
  CHECK(r.finish == FinishReason::stop);
  CHECK(r.stop_string == "STOP");
  CHECK(c.text == "Hello ");
  CHECK(r.completion_tokens == 3);
  // The text of the token that began the stop string was held, not emitted with it.
  REQUIRE(c.events.size() == 3);
  CHECK(c.events[1].text == "llo ");
}

TEST_CASE("logprobs and prompt_logprobs match the log-softmax of the backend's logits") {
  FakeVocab vocab;
  FakeBackend backend;
  Engine engine(backend, vocab, options());
  GenerationRequest req = greedy(chat_prompt(vocab, "lp"), 3);
  req.ignore_eos = true;
  req.logprobs = 3;
  req.prompt_logprobs = 1;
  Collected c;
  const auto r = run(engine, req, c);
  REQUIRE(c.events.size() == 3);
  std::vector<int32_t> ctx = req.prompt;
  for (const auto& e : c.events) {
    REQUIRE(e.logprob.has_value());
    const auto row = backend.logits_for(ctx);
    double lse = 0;
    const float mx = *std::max_element(row.begin(), row.end());
    for (float x : row) lse += std::exp(static_cast<double>(x) - mx);
    lse = std::log(lse) + mx;
    CHECK(e.logprob->logprob == doctest::Approx(row[static_cast<std::size_t>(e.token)] - lse).epsilon(1e-5));
    REQUIRE(e.logprob->top.size() == 3);
    CHECK(e.logprob->top[0].first == e.token);  // greedy: the chosen token is the most likely
    CHECK(e.logprob->top[0].second >= e.logprob->top[1].second);
    ctx.push_back(e.token);
  }
  REQUIRE(r.prompt_logprobs.size() == req.prompt.size());
  CHECK(!r.prompt_logprobs[0].has_value());
  for (std::size_t i = 1; i < req.prompt.size(); ++i) {
    REQUIRE(r.prompt_logprobs[i].has_value());
    CHECK(r.prompt_logprobs[i]->id == req.prompt[i]);
    const auto row = backend.logits_for(std::vector<int32_t>(req.prompt.begin(), req.prompt.begin() + static_cast<std::ptrdiff_t>(i)));
    const auto expect = token_logprob(row, req.prompt[i], 1);
    CHECK(r.prompt_logprobs[i]->logprob == doctest::Approx(expect.logprob).epsilon(1e-6));
    CHECK(r.prompt_logprobs[i]->top.size() == 1);
  }
}

TEST_CASE("a prompt_logprobs prefill runs in passes whose logits fit prompt_logits_bytes, with the same logprobs") {
  FakeVocab vocab;
  const GenerationRequest base = [&] {
    GenerationRequest r = greedy(chat_prompt(vocab, "a prompt long enough for several passes of rows"), 2);
    r.ignore_eos = true;
    r.prompt_logprobs = 2;
    return r;
  }();
  auto run_with = [&](std::size_t logits_bytes, std::vector<std::pair<std::size_t, std::size_t>>& passes) {
    FakeBackend backend;
    EngineOptions o = options();
    o.prefill_chunk = 64;
    o.prompt_logits_bytes = logits_bytes;
    Engine engine(backend, vocab, o);
    GenerationRequest req = base;
    Collected c;
    auto r = run(engine, req, c);
    passes = backend.passes();
    return r;
  };
  std::vector<std::pair<std::size_t, std::size_t>> whole, bounded;
  const auto a = run_with(std::size_t{1} << 30, whole);
  // Room for 5 rows of the fake vocabulary's logits: passes of 5 tokens, never more.
  const auto b = run_with(5 * sizeof(float) * k_fake_vocab + 3, bounded);
  REQUIRE(base.prompt.size() > 10);
  CHECK(whole.front().second == std::min<std::size_t>(64, base.prompt.size()));
  std::size_t prefill_tokens = 0;
  for (std::size_t i = 0; i < bounded.size() && prefill_tokens < base.prompt.size(); ++i) {
    CHECK(bounded[i].first == prefill_tokens);
    CHECK(bounded[i].second <= 5);
    prefill_tokens += bounded[i].second;
  }
  CHECK(prefill_tokens == base.prompt.size());
  REQUIRE(a.prompt_logprobs.size() == b.prompt_logprobs.size());
  for (std::size_t i = 1; i < a.prompt_logprobs.size(); ++i) {
    REQUIRE(b.prompt_logprobs[i].has_value());
    CHECK(b.prompt_logprobs[i]->logprob == doctest::Approx(a.prompt_logprobs[i]->logprob).epsilon(1e-6));
    CHECK(b.prompt_logprobs[i]->top == a.prompt_logprobs[i]->top);
  }
}

TEST_CASE("thinking_token_budget forces </think> once the reasoning block has used the budget") {
  FakeVocab vocab;
  // The model would think forever ('a' after 'a').
  FakeBackend backend([](const std::vector<int32_t>&) { return static_cast<int32_t>('a'); });
  Engine engine(backend, vocab, options());
  auto prompt = chat_prompt(vocab, "think");
  prompt.push_back(k_think);  // the template opened the block
  GenerationRequest req = greedy(prompt, 10);
  req.thinking_token_budget = 4;
  Collected c;
  const auto r = run(engine, req, c);
  REQUIRE(c.tokens.size() == 10);
  for (int i = 0; i < 4; ++i) CHECK(c.tokens[static_cast<std::size_t>(i)] == 'a');
  CHECK(c.tokens[4] == k_think_end);
  CHECK(c.tokens[5] == 'a');
  CHECK(r.reasoning_tokens == 4);
  CHECK(c.text == "aaaa</think>aaaaa");

  // Model opens the block itself: the budget counts from its <think>.
  FakeBackend opener([](const std::vector<int32_t>& ctx) {
    return ctx.back() == '\n' ? k_think : static_cast<int32_t>('b');
  });
  Engine engine2(opener, vocab, options());
  GenerationRequest req2 = greedy(chat_prompt(vocab, "t"), 6);
  req2.thinking_token_budget = 2;
  Collected c2;
  run(engine2, req2, c2);
  CHECK(c2.tokens == std::vector<int32_t>{k_think, 'b', 'b', k_think_end, 'b', 'b'});
}

TEST_CASE("KV cap refusal names both numbers") {
  CHECK(kv_cap_error(812, 4096, 1048576, 256, 16).value() ==
        "prompt 812 tokens + max_tokens 4096 = 4908 tokens exceeds the KV cache capacity of 4096 "
        "tokens (--kv-cache-bytes 1048576 / 256 bytes per token, in blocks of 16 tokens)");
  CHECK(!kv_cap_error(100, 3996, 1048576, 256, 16).has_value());
  // The capacity is whole blocks: 1000000 / 256 = 3906 tokens, 244 blocks of 16 = 3904.
  CHECK(kv_cap_error(3900, 5, 1000000, 256, 16).value().find("exceeds the KV cache capacity of 3904 tokens") != std::string::npos);
  CHECK(!kv_cap_error(3900, 4, 1000000, 256, 16).has_value());

  FakeVocab vocab;
  FakeBackend backend({}, 256);
  Engine engine(backend, vocab, options(64 * 256));  // 64 tokens
  CHECK(engine.kv_capacity_tokens() == 64);
  const auto msg = engine.check(20, 50);
  REQUIRE(msg.has_value());
  CHECK(msg->find("prompt 20 tokens + max_tokens 50 = 70 tokens exceeds the KV cache capacity of 64 tokens") == 0);
  CHECK(!engine.check(20, 44).has_value());
  auto len = engine.check(4000, 200);  // over max_model_len 4096 first
  REQUIRE(len.has_value());
  CHECK(len->find("maximum context length is 4096") != std::string::npos);

  Collected c;
  const auto r = run(engine, greedy(std::vector<int32_t>(20, 'a'), 50), c);
  CHECK(r.finish == FinishReason::error);
  CHECK(r.error.find("70 tokens") != std::string::npos);
  CHECK(backend.forward_calls == 0);
}

TEST_CASE("cancellation stops generation between tokens and frees the cache") {
  FakeVocab vocab;
  FakeBackend backend;
  backend.delay_ms = 2;
  Engine engine(backend, vocab, options());
  GenerationRequest req = greedy(chat_prompt(vocab, "long"), 3000);
  req.ignore_eos = true;
  std::promise<GenerationResult> done;
  auto fut = done.get_future();
  std::atomic<int> events{0};
  auto handle = engine.submit(
      req, [&](const GenerationEvent&) { ++events; }, [&](const GenerationResult& r) { done.set_value(r); });
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (events < 5 && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
  REQUIRE(events >= 5);
  handle->cancel();
  REQUIRE(fut.wait_for(std::chrono::seconds(10)) == std::future_status::ready);
  const auto r = fut.get();
  CHECK(r.finish == FinishReason::cancelled);
  CHECK(r.completion_tokens < 3000);
  CHECK(engine.stats().kv_blocks.held == 0);
  const auto calls = backend.forward_calls.load();
  CHECK(calls < 3000);
  CHECK(!engine.stats().running);
}

TEST_CASE("requests run FIFO; a request cancelled while queued finishes without running") {
  FakeVocab vocab;
  FakeBackend backend;
  backend.delay_ms = 1;
  Engine engine(backend, vocab, options());
  std::mutex m;
  std::vector<int> order;
  std::vector<std::promise<GenerationResult>> done(3);
  std::vector<std::shared_ptr<RequestHandle>> handles;
  for (int i = 0; i < 3; ++i) {
    GenerationRequest req = greedy(chat_prompt(vocab, "r"), 5);
    req.ignore_eos = true;
    handles.push_back(engine.submit(req, nullptr, [&, i](const GenerationResult& r) {
      {
        std::lock_guard lock(m);
        order.push_back(i);
      }
      done[static_cast<std::size_t>(i)].set_value(r);
    }));
  }
  handles[2]->cancel();
  std::vector<GenerationResult> results;
  for (auto& d : done) {
    auto f = d.get_future();
    REQUIRE(f.wait_for(std::chrono::seconds(10)) == std::future_status::ready);
    results.push_back(f.get());
  }
  CHECK(order == std::vector<int>{0, 1, 2});
  CHECK(results[0].completion_tokens == 5);
  CHECK(results[1].completion_tokens == 5);
  CHECK(results[2].finish == FinishReason::cancelled);
  CHECK(results[2].completion_tokens == 0);
}
