#include "worker/engine/sampler.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace servedeck::worker {

namespace {
constexpr double k_greedy_temperature = 1e-5;
// note: the sorted prefix starts at 256 candidates and grows 4x (256, 1024, 4096, ...): with
// LM-like logits the top-p prefix and the draw almost always end inside the first 256.
constexpr std::size_t k_first_prefix = 256;
constexpr std::size_t k_prefix_growth = 4;

using Candidate = std::pair<float, int32_t>;  // (logit, token id)

// The candidates' order: logit descending, ties by lower id. A strict total order (ids are unique),
// so any selection/sort with it yields the same sequence.
struct ByLogit {
  bool operator()(const Candidate& a, const Candidate& b) const {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  }
};

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

  // Candidates: every finite logit, as (logit, id).
  scratch_.clear();
  scratch_.reserve(logits.size());
  float max_logit = -std::numeric_limits<float>::infinity();
  for (std::size_t i = 0; i < logits.size(); ++i) {
    const float x = logits[i];
    if (!std::isfinite(x)) continue;
    scratch_.emplace_back(x, static_cast<int32_t>(i));
    max_logit = std::max(max_logit, x);
  }
  if (scratch_.empty()) return argmax(logits);
  const double inv_t = 1.0 / params_.temperature;

  if (params_.top_k > 0 && static_cast<std::size_t>(params_.top_k) < scratch_.size()) {
    const auto keep = static_cast<std::ptrdiff_t>(params_.top_k);
    std::partial_sort(scratch_.begin(), scratch_.begin() + keep, scratch_.end(), ByLogit{});
    scratch_.resize(static_cast<std::size_t>(keep));
    return draw_sorted(inv_t);
  }
  return draw_prefix(inv_t, max_logit);
}

int32_t Sampler::draw_sorted(double inv_t) {
  // Softmax of logits / T over the candidates (scratch_, sorted by ByLogit{}).
  const double top = scratch_.front().first * inv_t;
  probs_.resize(scratch_.size());
  double sum = 0.0;
  for (std::size_t i = 0; i < scratch_.size(); ++i) {
    probs_[i] = std::exp(scratch_[i].first * inv_t - top);
    sum += probs_[i];
  }
  // Top-p: the smallest prefix whose mass reaches top_p (at least one token).
  std::size_t n = probs_.size();
  if (params_.top_p > 0.0 && params_.top_p < 1.0) {
    double cum = 0.0;
    n = 0;
    while (n < probs_.size()) {
      cum += probs_[n] / sum;
      ++n;
      if (cum >= params_.top_p) break;
    }
    sum = 0.0;
    for (std::size_t i = 0; i < n; ++i) sum += probs_[i];
  }
  return walk(sum, n);
}

int32_t Sampler::walk(double sum, std::size_t n) {
  std::uniform_real_distribution<double> u(0.0, sum);
  const double r = u(rng_);
  double acc = 0.0;
  for (std::size_t i = 0; i < n; ++i) {
    acc += probs_[i];
    if (r < acc) return scratch_[i].second;
  }
  return scratch_[n - 1].second;
}

void Sampler::extend_prefix(double inv_t, double top) {
  const std::size_t n = scratch_.size();
  const std::size_t next = std::min(n, std::max(k_first_prefix, prefix_ * k_prefix_growth));
  const auto first = scratch_.begin() + static_cast<std::ptrdiff_t>(prefix_);
  const auto last = scratch_.begin() + static_cast<std::ptrdiff_t>(next);
  if (next < n) std::nth_element(first, last, scratch_.end(), ByLogit{});
  std::sort(first, last, ByLogit{});
  for (std::size_t i = prefix_; i < next; ++i) probs_.push_back(std::exp(scratch_[i].first * inv_t - top));
  prefix_ = next;
}

int32_t Sampler::draw_full_sort(double inv_t) {
  // scratch_[0, prefix_) already holds the best candidates in order; sort the rest after them.
  std::sort(scratch_.begin() + static_cast<std::ptrdiff_t>(prefix_), scratch_.end(), ByLogit{});
  return draw_sorted(inv_t);
}

int32_t Sampler::draw_prefix(double inv_t, float max_logit) {
  // The sorted draw (draw_sorted) over all n candidates, from the sorted prefix it actually reads.
  // It reads the full sum S = p[0] + p[1] + ... + p[n-1] (added in sorted order) only through
  // comparisons that are monotone in S: the top-p cumulative adds fl(p[i] / S) (each nonincreasing
  // in S), and without top-p the draw is r = fl(c * S) for the generator's canonical c. So compute
  // s = the same p[i] added in index order (one O(V) pass, no sort) and bracket S: both S and s are
  // recursive sums of the same n nonnegative doubles, each within gamma_{n-1} = (n-1)u/(1-(n-1)u) of
  // the exact sum (Higham, Accuracy and Stability of Numerical Algorithms, 2nd ed., eq. 4.4), so
  // S lies in [s(1-d), s(1+d)] with d = 4(n+1)u (> 2 gamma/(1-gamma) plus the rounding of the bounds).
  // If the decision is the same at both ends it is the decision at S; if not (probability ~d), or
  // anything is not finite, fall back to the full sort.
  const std::size_t n = scratch_.size();
  const double top = max_logit * inv_t;  // == scratch_-sorted front().first * inv_t (same value)
  double s = 0.0;
  for (const Candidate& c : scratch_) s += std::exp(c.first * inv_t - top);
  prefix_ = 0;
  probs_.clear();
  if (!std::isfinite(s) || !(s > 0.0)) return draw_full_sort(inv_t);
  const double d = 4.0 * (static_cast<double>(n) + 1.0) * (std::numeric_limits<double>::epsilon() / 2.0);
  const double s_lo = s * (1.0 - d);
  const double s_hi = s * (1.0 + d);

  const double top_p = params_.top_p;
  if (top_p > 0.0 && top_p < 1.0) {
    double cum_lo = 0.0;  // the top-p cumulative with s_hi: <= the one with S
    double cum_hi = 0.0;  // with s_lo: >= the one with S
    std::size_t keep = n;
    for (std::size_t k = 0;;) {
      if (k == prefix_) {
        if (prefix_ == n) break;  // no prefix reaches top_p: keep all, as the sorted draw does
        extend_prefix(inv_t, top);
      }
      cum_lo += probs_[k] / s_hi;
      cum_hi += probs_[k] / s_lo;
      ++k;
      if (cum_hi >= top_p) {
        if (!(cum_lo >= top_p)) return draw_full_sort(inv_t);  // S decides: sort
        keep = k;
        break;
      }
    }
    double sum = 0.0;
    for (std::size_t i = 0; i < keep; ++i) sum += probs_[i];
    return walk(sum, keep);
  }

  // No top-p: the draw r = u(0, S) falls in [u(0, s_lo), u(0, s_hi)], drawn on copies of the generator.
  std::mt19937_64 rng_lo = rng_;
  std::mt19937_64 rng_hi = rng_;
  const double r_lo = std::uniform_real_distribution<double>(0.0, s_lo)(rng_lo);
  const double r_hi = std::uniform_real_distribution<double>(0.0, s_hi)(rng_hi);
  if (rng_lo != rng_hi) return draw_full_sort(inv_t);  // not one draw's worth of bits each: be safe
  double acc = 0.0;
  for (std::size_t k = 0;; ++k) {
    if (k == prefix_) {
      if (prefix_ == n) {  // r >= every partial sum: the sorted draw returns the last candidate
        rng_ = rng_lo;
        return scratch_[n - 1].second;
      }
      extend_prefix(inv_t, top);
    }
    acc += probs_[k];
    if (r_lo < acc) {
      if (!(r_hi < acc)) return draw_full_sort(inv_t);  // S decides: sort
      rng_ = rng_lo;
      return scratch_[k].second;
    }
  }
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
