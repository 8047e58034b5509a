#include "worker/engine/sampler.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace servedeck::worker {

namespace {
constexpr double k_greedy_temperature = 1e-5;

double log_sum_exp(std::span<const float> logits, float max_logit) {
  double s = 0.0;
  for (float x : logits) s += std::exp(static_cast<double>(x) - max_logit);
  return std::log(s) + max_logit;
}
}  // namespace

Sampler::Sampler(SamplingParams params)
    : params_(params), rng_(params.seed ? *params.seed : std::random_device{}()) {}

int32_t argmax(std::span<const float> logits) {
  int32_t best = 0;
  for (std::size_t i = 1; i < logits.size(); ++i) {
    if (logits[i] > logits[static_cast<std::size_t>(best)]) best = static_cast<int32_t>(i);
  }
  return best;
}

int32_t Sampler::sample(std::span<const float> logits) {
  if (logits.empty()) return 0;
  if (params_.temperature <= k_greedy_temperature || params_.top_k == 1) return argmax(logits);

  // Candidates sorted by logit, descending (ties by id for determinism).
  scratch_.clear();
  scratch_.reserve(logits.size());
  for (std::size_t i = 0; i < logits.size(); ++i) {
    if (std::isfinite(logits[i])) scratch_.emplace_back(logits[i], static_cast<int32_t>(i));
  }
  if (scratch_.empty()) return argmax(logits);
  auto by_logit = [](const auto& a, const auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); };
  std::size_t keep = scratch_.size();
  if (params_.top_k > 0 && static_cast<std::size_t>(params_.top_k) < keep) {
    keep = static_cast<std::size_t>(params_.top_k);
    std::partial_sort(scratch_.begin(), scratch_.begin() + static_cast<std::ptrdiff_t>(keep), scratch_.end(), by_logit);
    scratch_.resize(keep);
  } else {
    std::sort(scratch_.begin(), scratch_.end(), by_logit);
  }
  // Softmax of logits / T over the candidates.
  const double inv_t = 1.0 / params_.temperature;
  const double top = scratch_.front().first * inv_t;
  std::vector<double> p(scratch_.size());
  double sum = 0.0;
  for (std::size_t i = 0; i < scratch_.size(); ++i) {
    p[i] = std::exp(scratch_[i].first * inv_t - top);
    sum += p[i];
  }
  // Top-p: the smallest prefix whose mass reaches top_p (at least one token).
  if (params_.top_p > 0.0 && params_.top_p < 1.0) {
    double cum = 0.0;
    std::size_t n = 0;
    while (n < p.size()) {
      cum += p[n] / sum;
      ++n;
      if (cum >= params_.top_p) break;
    }
    p.resize(n);
    sum = 0.0;
    for (double x : p) sum += x;
  }
  std::uniform_real_distribution<double> u(0.0, sum);
  const double r = u(rng_);
  double acc = 0.0;
  for (std::size_t i = 0; i < p.size(); ++i) {
    acc += p[i];
    if (r < acc) return scratch_[i].second;
  }
  return scratch_[p.size() - 1].second;
}

TokenLogprob token_logprob(std::span<const float> logits, int32_t id, int top_n) {
  TokenLogprob out;
  out.id = id;
  if (logits.empty()) return out;
  const float max_logit = *std::max_element(logits.begin(), logits.end());
  const double lse = log_sum_exp(logits, max_logit);
  if (id >= 0 && static_cast<std::size_t>(id) < logits.size()) {
    const float mine = logits[static_cast<std::size_t>(id)];
    out.logprob = static_cast<float>(mine - lse);
    out.rank = 1 + static_cast<int>(std::count_if(logits.begin(), logits.end(), [mine](float x) { return x > mine; }));
  } else {
    out.logprob = -std::numeric_limits<float>::infinity();
    out.rank = static_cast<int>(logits.size());
  }
  if (top_n > 0) {
    const std::size_t n = std::min(static_cast<std::size_t>(top_n), logits.size());
    std::vector<int32_t> idx(logits.size());
    for (std::size_t i = 0; i < idx.size(); ++i) idx[i] = static_cast<int32_t>(i);
    std::partial_sort(idx.begin(), idx.begin() + static_cast<std::ptrdiff_t>(n), idx.end(), [&](int32_t a, int32_t b) {
      const float la = logits[static_cast<std::size_t>(a)], lb = logits[static_cast<std::size_t>(b)];
      return la > lb || (la == lb && a < b);
    });
    for (std::size_t i = 0; i < n; ++i)
      out.top.emplace_back(idx[i], static_cast<float>(logits[static_cast<std::size_t>(idx[i])] - lse));
  }
  return out;
}

}  // namespace servedeck::worker
