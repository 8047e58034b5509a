// Sampling, stop strings and UTF-8 holdback, without the scheduler.
#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include "worker/engine/sampler.hpp"
#include "worker/engine/stop_matcher.hpp"

using namespace servedeck::worker;

TEST_CASE("greedy picks the argmax; top_k 1 and a tiny top_p are greedy too") {
  const std::vector<float> logits = {0.5f, 2.0f, 1.9f, -3.0f};
  for (double t : {0.0, 1e-7}) {
    Sampler s({t, 0, 1.0, 1});
    CHECK(s.sample(logits) == 1);
  }
  Sampler k1({1.5, 1, 1.0, 7});
  Sampler p0({1.5, 0, 1e-9, 7});
  for (int i = 0; i < 50; ++i) {
    CHECK(k1.sample(logits) == 1);
    CHECK(p0.sample(logits) == 1);
  }
}

TEST_CASE("seeded sampling is reproducible; different seeds differ") {
  std::vector<float> logits(100);
  for (std::size_t i = 0; i < logits.size(); ++i) logits[i] = static_cast<float>(std::sin(i * 0.7) * 2.0);
  auto draw = [&](uint64_t seed) {
    Sampler s({0.8, 40, 0.95, seed});
    std::vector<int32_t> out;
    for (int i = 0; i < 64; ++i) out.push_back(s.sample(logits));
    return out;
  };
  CHECK(draw(42) == draw(42));
  CHECK(draw(42) != draw(43));
}

TEST_CASE("temperature sampling follows the softmax; top-k and top-p restrict the support") {
  const std::vector<float> logits = {0.0f, std::log(3.0f), -50.0f};
  Sampler s({1.0, 0, 1.0, 123});
  int ones = 0;
  const int n = 4000;
  for (int i = 0; i < n; ++i) ones += s.sample(logits) == 1;
  const double frac = static_cast<double>(ones) / n;
  CHECK(frac > 0.72);  // expected 0.75; 4000 draws have sd ~0.007
  CHECK(frac < 0.78);

  const std::vector<float> flat = {1.0f, 1.0f, 1.0f, 1.0f, 0.9f};
  Sampler k2({1.0, 2, 1.0, 5});
  for (int i = 0; i < 200; ++i) {
    const int32_t t = k2.sample(flat);
    CHECK(t < 2);  // the two best (ties broken by id)
  }
  // top_p 0.5 over four equal tokens of five: the first two reach 0.5 of the mass.
  Sampler p({1.0, 0, 0.4, 9});
  for (int i = 0; i < 200; ++i) CHECK(p.sample(flat) < 2);
}

TEST_CASE("token_logprob is log-softmax with sorted alternatives") {
  const std::vector<float> logits = {1.0f, 3.0f, 2.0f};
  const double lse = std::log(std::exp(1.0) + std::exp(3.0) + std::exp(2.0));
  const auto lp = token_logprob(logits, 2, 2);
  CHECK(lp.logprob == doctest::Approx(2.0 - lse).epsilon(1e-6));
  REQUIRE(lp.top.size() == 2);
  CHECK(lp.top[0].first == 1);
  CHECK(lp.top[1].first == 2);
  CHECK(lp.top[0].second == doctest::Approx(3.0 - lse).epsilon(1e-6));
}

TEST_CASE("stop strings are never emitted, across every split of the text") {
  const std::string text = "Hello STOP there";
  for (std::size_t i = 0; i <= text.size(); ++i) {
    for (std::size_t j = i; j <= text.size(); ++j) {
      StopMatcher m({"STOP", "xyz"});
      std::string out = m.push(text.substr(0, i));
      out += m.push(text.substr(i, j - i));
      out += m.push(text.substr(j));
      out += m.flush();
      CHECK_MESSAGE(out == "Hello ", "splits " << i << "," << j);
      CHECK(m.stopped());
      CHECK(m.matched() == "STOP");
    }
  }
  StopMatcher none({"STOP"});
  std::string out = none.push("no ST");
  CHECK(out == "no ");  // "ST" held: it may begin "STOP"
  out += none.push("ill");
  out += none.flush();
  CHECK(out == "no STill");
  CHECK(!none.stopped());
}

TEST_CASE("utf-8 holdback never splits a character") {
  const std::string euro = "\xE2\x82\xAC";  // U+20AC
  Utf8Holdback h;
  CHECK(h.push("a\xE2") == "a");
  CHECK(h.push("\x82") == "");
  CHECK(h.push("\xAC" "b") == euro + "b");
  CHECK(h.push("\xF0\x9F") == "");
  CHECK(h.flush() == "\xF0\x9F");
}
