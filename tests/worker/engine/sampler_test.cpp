// Sampling, stop strings and UTF-8 holdback, without the scheduler.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <span>
#include <stdexcept>
#include <utility>
#include <vector>

#include "worker/engine/sampler.hpp"
#include "worker/engine/stop_matcher.hpp"
#include "tests/worker/engine/reference_sampler.hpp"

using namespace servedeck::worker;

namespace {

// ---- Reference: the sampler before its prefix-only rewrite (reference_sampler.hpp).
using RefCandidates = reference::Candidates;

int32_t reference_argmax(std::span<const float> logits) { return reference::argmax(logits); }

RefCandidates reference_candidates(std::span<const float> logits, int top_k) { return reference::candidates(logits, top_k); }

int32_t reference_draw(std::span<const float> logits, const RefCandidates& scratch, const SamplingParams& params,
                       std::mt19937_64& rng) {
  return reference::draw(logits, scratch, params, rng);
}

// The reference's top-p running sum after `k` candidates (k >= 1), for boundary tests.
double reference_cumulative(const RefCandidates& scratch, double temperature, std::size_t k) {
  double sum = 0.0;
  const std::vector<double> p = reference::weights(scratch, temperature, sum);
  double cum = 0.0;
  for (std::size_t i = 0; i < k; ++i) cum += p[i] / sum;
  return cum;
}
// ---- end of the reference.

constexpr std::size_t k_qwen3_vocab = 151936;

// LM-like row: Gaussian(0, sd) plus `n_outliers` tokens 8..20 above; `step` > 0 rounds to
// multiples of step (many ties); `bad` entries become -inf, +inf or NaN.
std::vector<float> make_row(std::mt19937_64& g, std::size_t n, double sd, int n_outliers, double step, std::size_t bad) {
  std::normal_distribution<double> gauss(0.0, sd);
  std::uniform_int_distribution<std::size_t> pick(0, n - 1);
  std::uniform_real_distribution<double> lift(8.0, 20.0);
  std::vector<float> row(n);
  for (float& x : row) {
    double v = gauss(g);
    if (step > 0.0) v = std::round(v / step) * step;
    x = static_cast<float>(v);
  }
  for (int i = 0; i < n_outliers; ++i) {
    double v = lift(g);
    if (step > 0.0) v = std::round(v / step) * step;
    row[pick(g)] = static_cast<float>(v);
  }
  const float specials[] = {-std::numeric_limits<float>::infinity(), std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN()};
  for (std::size_t i = 0; i < bad; ++i) row[pick(g)] = specials[i % 3];
  return row;
}

// Runs `draws` tokens with one new Sampler and one reference generator (same seed) over `rows`
// (cycled from first_row), so a draw the new code skips or adds would desynchronise every later token.
void check_stream(const std::vector<std::vector<float>>& rows, const std::vector<RefCandidates>& sorted_all,
                  const SamplingParams& params, int draws, std::size_t first_row = 0) {
  Sampler s(params);
  std::mt19937_64 rng(*params.seed);
  for (int i = 0; i < draws; ++i) {
    const std::size_t r = (first_row + static_cast<std::size_t>(i)) % rows.size();
    const auto& row = rows[r];
    const RefCandidates cands = params.top_k > 0 ? reference_candidates(row, params.top_k) : sorted_all[r];
    const int32_t want = reference_draw(row, cands, params, rng);
    const int32_t got = s.sample(row);
    REQUIRE_MESSAGE(got == want, "row " << r << " (size " << row.size() << ") draw " << i << " T=" << params.temperature
                                        << " top_p=" << params.top_p << " top_k=" << params.top_k
                                        << " seed=" << *params.seed);
  }
}

}  // namespace

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

TEST_CASE("argmax is the reference's: first of the largest, NaN ignored unless at index 0") {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  const float pool[] = {0.0f, -0.0f, 1.0f, 1.0f, -1.0f, inf, -inf, nan, 2.5f, 2.5f};
  std::mt19937_64 g(5);
  std::uniform_int_distribution<std::size_t> pick(0, std::size(pool) - 1);
  for (int trial = 0; trial < 4000; ++trial) {
    // Lengths 1..67: the scalar path, and the four-by-four SIMD pass (17 and more) with its tail.
    std::vector<float> row(1 + static_cast<std::size_t>(trial % 67));
    for (float& x : row) x = pool[pick(g)];
    REQUIRE_MESSAGE(argmax(row) == reference_argmax(row), "trial " << trial);
  }
  CHECK(argmax(std::vector<float>{nan, 5.0f, 7.0f}) == 0);
  CHECK(argmax(std::vector<float>{1.0f, nan, 7.0f, 2.0f, 7.0f, 3.0f, 4.0f, 5.0f, 6.0f}) == 2);
  CHECK(argmax(std::vector<float>{}) == 0);
  // A vocabulary-size row: the maximum planted twice, after NaNs and equal-valued zeros.
  std::vector<float> big(151936);
  std::normal_distribution<float> logit(0.0f, 3.0f);
  for (float& x : big) x = logit(g);
  big[7] = nan;
  big[90001] = 40.0f;
  big[120000] = 40.0f;
  CHECK(argmax(big) == 90001);
  CHECK(argmax(big) == reference_argmax(big));
  big[3] = 40.0f;
  CHECK(argmax(big) == 3);
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

TEST_CASE("sample() gives the reference (full-sort) sampler's tokens: small vocabularies") {
  std::mt19937_64 g(20261129);
  const double temps[] = {0.1, 0.3, 0.6, 0.7, 1.0, 1.5, 2.0};
  const double top_ps[] = {0.1, 0.5, 0.8, 0.95, 1.0};
  const int top_ks[] = {0, 1, 20, 50};
  std::uniform_int_distribution<std::size_t> size(1, 500);
  int checked = 0;
  for (int set = 0; set < 6; ++set) {
    std::vector<std::vector<float>> rows;
    std::vector<RefCandidates> sorted;
    for (int i = 0; i < 3; ++i) {
      const std::size_t n = size(g);
      const double sd = (set % 4 == 0) ? 0.3 : 3.0;   // flat rows need deep prefixes
      const double step = (set % 3 == 0) ? 0.5 : 0.0; // many exact ties
      rows.push_back(make_row(g, n, sd, static_cast<int>(set % 5), step, (set % 2) ? n / 10 + 1 : 0));
      sorted.push_back(reference_candidates(rows.back(), 0));
    }
    for (double t : temps)
      for (double p : top_ps)
        for (int k : top_ks) {
          check_stream(rows, sorted, {t, k, p, static_cast<uint64_t>(set * 1000 + checked)}, 4);
          ++checked;
        }
  }
  CHECK(checked == 6 * 7 * 5 * 4);

  // Rows with nothing or one thing to sample.
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<std::vector<float>> odd = {{-inf, -inf}, {nan, 1.0f, -inf}, {inf, nan, -2.0f, inf}, {0.0f}, {-0.0f, 0.0f, -0.0f}};
  for (const auto& row : odd) {
    for (double p : top_ps) {
      const SamplingParams params{0.8, 0, p, 5};
      Sampler s(params);
      std::mt19937_64 rng(5);
      for (int i = 0; i < 4; ++i) CHECK(s.sample(row) == reference_draw(row, reference_candidates(row, 0), params, rng));
    }
  }
}

TEST_CASE("sample() gives the reference sampler's tokens: Qwen3-size rows (151936)") {
  std::mt19937_64 g(7);
  std::vector<std::vector<float>> rows;
  rows.push_back(make_row(g, k_qwen3_vocab, 3.0, 8, 0.0, 50));      // LM-like: a few dominant tokens; -inf/NaN
  rows.push_back(make_row(g, k_qwen3_vocab, 1.0, 2, 0.125, 1000));  // flat-ish, heavy ties
  std::vector<RefCandidates> sorted;
  for (const auto& row : rows) sorted.push_back(reference_candidates(row, 0));
  const struct {
    double t;
    int k;
    double p;
  } sets[] = {{0.7, 0, 0.8}, {0.6, 0, 0.95}, {1.0, 0, 1.0}, {0.1, 0, 0.5}, {1.5, 0, 0.1},
              {0.6, 20, 0.95}, {1.0, 50, 1.0}, {0.3, 1, 0.9}, {2.0, 0, 0.95}};
  uint64_t seed = 11;
  std::size_t first_row = 0;
  for (const auto& set : sets) check_stream(rows, sorted, {set.t, set.k, set.p, seed++}, 2, first_row++);
}

TEST_CASE("top_p exactly at a running sum of the reference: the boundary token is kept as before") {
  // When top_p equals the reference's running sum after k candidates, the last bits of the full
  // sum decide the prefix: the new sampler must resolve it the same way (it sorts in that case).
  std::mt19937_64 g(99);
  for (std::size_t n : {std::size_t{50}, std::size_t{1000}}) {
    const auto row = make_row(g, n, 2.0, 0, 0.0, 0);
    const RefCandidates sorted = reference_candidates(row, 0);
    for (double t : {0.5, 1.0}) {
      for (std::size_t k : {std::size_t{1}, std::size_t{3}, std::size_t{17}}) {
        const double c = reference_cumulative(sorted, t, k);
        for (double p : {c, std::nextafter(c, 0.0), std::nextafter(c, 1.0)}) {
          if (!(p > 0.0 && p < 1.0)) continue;
          const SamplingParams params{t, 0, p, k + n};
          Sampler s(params);
          std::mt19937_64 rng(k + n);
          for (int i = 0; i < 4; ++i) {
            const int32_t want = reference_draw(row, sorted, params, rng);
            REQUIRE(s.sample(row) == want);
          }
        }
      }
    }
  }
}

TEST_CASE("a draw that lands past the exactly-summed head (top_p 1, draw > 0.9999) matches the reference") {
  // One token at logit 0 and 50000 at -20.01 (each weight e^-20.01 = 2.0e-9 of the top's, 1.0e-4 in
  // all): a draw above 1/(1 + 1.0e-4) of the mass walks into the tail, which the new sampler only
  // bins; it must load, sort and (its bracket being too wide there) fall back to the full sort.
  std::vector<float> row(50001, -20.01f);
  row[777] = 0.0f;
  const RefCandidates sorted = reference_candidates(row, 0);
  uint64_t seed = 0;
  for (uint64_t s = 1; s < 2000000; ++s) {  // the first draw's canonical number c, as u(0, 1) reads it
    std::mt19937_64 g(s);
    if (std::uniform_real_distribution<double>(0.0, 1.0)(g) > 0.99995) {
      seed = s;
      break;
    }
  }
  REQUIRE(seed != 0);
  const SamplingParams params{1.0, 0, 1.0, seed};
  Sampler s(params);
  std::mt19937_64 rng(seed);
  const int32_t want = reference_draw(row, sorted, params, rng);
  CHECK(want != 777);  // the reference's draw is in the tail indeed
  CHECK(s.sample(row) == want);
  CHECK(s.sample(row) == reference_draw(row, sorted, params, rng));  // and the generators stay in step
}

TEST_CASE("non-finite scaled logits (huge logits, tiny or NaN temperature) replay the reference") {
  std::vector<float> row = {3e38f, -3e38f, 1.0f, 3e38f, -1.0f};
  for (double t : {2e-5, 1e-3, 1.0, std::numeric_limits<double>::infinity(), std::numeric_limits<double>::quiet_NaN()}) {
    for (double p : {0.5, 1.0}) {
      const SamplingParams params{t, 0, p, 3};
      Sampler s(params);
      std::mt19937_64 rng(3);
      for (int i = 0; i < 3; ++i) CHECK(s.sample(row) == reference_draw(row, reference_candidates(row, 0), params, rng));
    }
  }
  const std::vector<float> negative = {-3e38f, -3e38f, -2e38f};
  const SamplingParams params{1e-4, 0, 1.0, 4};
  Sampler s(params);
  std::mt19937_64 rng(4);
  for (int i = 0; i < 3; ++i) CHECK(s.sample(negative) == reference_draw(negative, reference_candidates(negative, 0), params, rng));
}

TEST_CASE("draws decided among light tokens (e^-10.5 .. e^-11.5 of the top's) match the reference") {
  // One token at 10, 8000 at -1.5 .. -0.5 (about 12% of the mass in all, each ~1.7e-5 of the top's),
  // 300 far below and a few NaN: top-p cut-offs and some draws fall among the light ones, which the
  // new sampler first only bins and then sums exactly.
  std::mt19937_64 g(31);
  std::uniform_real_distribution<double> light(-1.5, -0.5), far(-40.0, -11.0);
  std::vector<float> row;
  row.push_back(10.0f);
  for (int i = 0; i < 8000; ++i) row.push_back(static_cast<float>(light(g)));
  for (int i = 0; i < 300; ++i) row.push_back(static_cast<float>(far(g)));
  for (int i = 0; i < 5; ++i) row.push_back(std::numeric_limits<float>::quiet_NaN());
  std::shuffle(row.begin(), row.end(), g);
  const RefCandidates sorted = reference_candidates(row, 0);
  const float top_logit = sorted.front().first;
  int light_hits = 0;
  for (const auto& [p, draws] : {std::pair{1.0, 60}, std::pair{0.95, 10}, std::pair{0.9, 10}}) {
    const SamplingParams params{1.0, 0, p, static_cast<uint64_t>(draws) + 100};
    Sampler s(params);
    std::mt19937_64 rng(*params.seed);
    for (int i = 0; i < draws; ++i) {
      const int32_t want = reference_draw(row, sorted, params, rng);
      REQUIRE(s.sample(row) == want);
      light_hits += row[static_cast<std::size_t>(want)] < top_logit ? 1 : 0;
    }
  }
  CHECK(light_hits > 0);  // the case this test is for did occur
}

// Sampler::sample_top reads only top_logits(row, top_k) and the row's argmax: fed those, it gives
// sample()'s token for the same generator, draw for draw (what a backend's device selection
// relies on: Backend::forward_top_k).
TEST_CASE("top_logits are the reference's top-k candidates; sample_top on them gives sample()'s tokens") {
  std::mt19937_64 g(20261207);
  std::uniform_int_distribution<std::size_t> size(1, 3000);
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  int checked = 0;
  for (int set = 0; set < 12; ++set) {
    const std::size_t n = set == 11 ? 151936 : size(g);
    std::vector<float> row = make_row(g, n, set % 3 == 0 ? 0.3 : 3.0, set % 5, set % 4 == 0 ? 0.5 : 0.0, set % 2 ? n / 10 + 1 : 0);
    if (set == 7) row.assign(n, nan);            // nothing finite: the argmax decides
    if (set == 8) row[n / 2] = inf;              // +inf is never a candidate
    for (const int k : {2, 20, 64, 1000}) {
      if (static_cast<std::size_t>(k) >= n) continue;
      CAPTURE(set);
      CAPTURE(k);
      const auto best = top_logits(row, static_cast<std::size_t>(k));
      const auto ref = reference_candidates(row, k);
      REQUIRE(best.size() == ref.size());
      for (std::size_t i = 0; i < best.size(); ++i) CHECK((best[i].first == ref[i].first && best[i].second == ref[i].second));
      for (const double t : {0.6, 1.0, 1.7})
        for (const double p : {0.8, 0.95, 1.0}) {
          const SamplingParams params{t, k, p, static_cast<uint64_t>(set * 100 + k)};
          Sampler whole(params), selected(params);
          for (int draw = 0; draw < 5; ++draw) CHECK(selected.sample_top(best, argmax(row)) == whole.sample(row));
          ++checked;
        }
    }
  }
  CHECK(checked > 250);
  Sampler greedy_one(SamplingParams{0.0, 20, 1.0, 1});
  const std::vector<std::pair<float, int32_t>> one = {{1.0f, 3}};
  CHECK_THROWS_AS(greedy_one.sample_top(one, 3), std::logic_error);
  Sampler no_k(SamplingParams{0.7, 0, 1.0, 1});
  CHECK_THROWS_AS(no_k.sample_top(one, 3), std::logic_error);
}
