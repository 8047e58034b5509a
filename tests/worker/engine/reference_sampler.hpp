// The token sampler as it was before its prefix-only rewrite (commit e3d607b, verbatim
// arithmetic), kept as the reference the new sampler must match token for token: its test
// (sampler_test.cpp) compares them, and bench/sampler times them side by side. Split in two so
// a test can sort a 151936-entry row once and reuse it: reference_candidates is the copy + sort
// (or partial_sort for top_k), reference_draw the rest (softmax in sorted order, top-p, the one
// uniform draw).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <span>
#include <utility>
#include <vector>

#include "worker/engine/sampler.hpp"

namespace servedeck::worker::reference {

using Candidates = std::vector<std::pair<float, int32_t>>;

/// The old argmax: first index of a strictly larger logit, from index 0.
inline int32_t argmax(std::span<const float> logits) {
  int32_t best = 0;
  for (std::size_t i = 1; i < logits.size(); ++i) {
    if (logits[i] > logits[static_cast<std::size_t>(best)]) best = static_cast<int32_t>(i);
  }
  return best;
}

/// Every finite logit as (logit, id), sorted by logit descending, ties by lower id (the top_k
/// first only, by partial_sort, when 0 < top_k < their number), into `scratch` (reused).
inline void candidates(std::span<const float> logits, int top_k, Candidates& scratch) {
  scratch.clear();
  scratch.reserve(logits.size());
  for (std::size_t i = 0; i < logits.size(); ++i) {
    if (std::isfinite(logits[i])) scratch.emplace_back(logits[i], static_cast<int32_t>(i));
  }
  auto by_logit = [](const auto& a, const auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); };
  std::size_t keep = scratch.size();
  if (top_k > 0 && static_cast<std::size_t>(top_k) < keep) {
    keep = static_cast<std::size_t>(top_k);
    std::partial_sort(scratch.begin(), scratch.begin() + static_cast<std::ptrdiff_t>(keep), scratch.end(), by_logit);
    scratch.resize(keep);
  } else {
    std::sort(scratch.begin(), scratch.end(), by_logit);
  }
}

inline Candidates candidates(std::span<const float> logits, int top_k) {
  Candidates scratch;
  candidates(logits, top_k, scratch);
  return scratch;
}

/// exp(logit / T - top / T) of each candidate in sorted order, and their sum in that order.
inline std::vector<double> weights(const Candidates& scratch, double temperature, double& sum) {
  const double inv_t = 1.0 / temperature;
  const double top = scratch.front().first * inv_t;
  std::vector<double> p(scratch.size());
  sum = 0.0;
  for (std::size_t i = 0; i < scratch.size(); ++i) {
    p[i] = std::exp(scratch[i].first * inv_t - top);
    sum += p[i];
  }
  return p;
}

/// The old Sampler::sample after the sort; `scratch` from candidates with the same top_k.
inline int32_t draw(std::span<const float> logits, const Candidates& scratch, const SamplingParams& params, std::mt19937_64& rng) {
  if (logits.empty()) return 0;
  if (params.temperature <= 1e-5 || params.top_k == 1) return argmax(logits);
  if (scratch.empty()) return argmax(logits);
  double sum = 0.0;
  std::vector<double> p = weights(scratch, params.temperature, sum);
  if (params.top_p > 0.0 && params.top_p < 1.0) {
    double cum = 0.0;
    std::size_t n = 0;
    while (n < p.size()) {
      cum += p[n] / sum;
      ++n;
      if (cum >= params.top_p) break;
    }
    p.resize(n);
    sum = 0.0;
    for (double x : p) sum += x;
  }
  std::uniform_real_distribution<double> u(0.0, sum);
  const double r = u(rng);
  double acc = 0.0;
  for (std::size_t i = 0; i < p.size(); ++i) {
    acc += p[i];
    if (r < acc) return scratch[i].second;
  }
  return scratch[p.size() - 1].second;
}

}  // namespace servedeck::worker::reference
