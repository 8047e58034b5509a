#include "worker/engine/sampler.hpp"

#include <algorithm>
#if defined(__SSE2__)
#include <immintrin.h>
#endif
#include <cmath>
#include <iterator>
#include <limits>
#include <stdexcept>
#include <string>

namespace servedeck::worker {

namespace {
constexpr double k_greedy_temperature = 1e-5;
// note: the sorted prefix starts at 256 candidates (or prefix_hint's estimate, if larger) and grows
// 4x: with LM-like logits the top-p prefix and the draw almost always end inside the first 256.
constexpr std::size_t k_first_prefix = 256;
constexpr std::size_t k_prefix_growth = 4;
// The candidates by y = logit / T - max_logit / T (the log of the weight p relative to the top
// token's, <= 0): the head (y >= -10) gets its exact p at once; the middle (-10 > y >= about -20)
// only if the head does not decide; the tail (below: p < 2.1e-9 each) never. Below the head, p is
// counted in bins of 1/256 octave (log2 p), from 64 octaves under e^-20 up to past e^-10; the
// middle and the tail are the bins at and above, and below, e^-20 (a bin edge), plus one bin for
// deeper. note: -10 (e^-10 = 4.5e-5) keeps the first try to a few hundred exp calls on LM-like
// rows; -20 keeps the second one's bracket under n * 2.1e-9 * 0.27% = 8.6e-7 of S (n = 151936;
// S >= 1, the top token's p), and ~1e-10 on LM-like rows, whose tail weighs far less.
constexpr double k_quick_depth = 10.0;
constexpr double k_head_depth = 20.0;
constexpr int k_bins_per_octave = 256;
constexpr int k_tail_octaves = 64;
constexpr int k_head_bins_per_octave = 16;  // for prefix_hint only
constexpr int k_mid_octaves = 15;  // the middle spans 10 * log2(e) = 14.4 octaves
constexpr double k_log2e = 1.4426950408889634;  // log2(e), rounded to double
// note: 1e-6 relative covers, with a wide margin, every rounding between a binned p and its bin's
// edges (exp's last bit, z = y * log2e, the bin index, the edge values, the bound sums: all < 1e-11).
constexpr double k_bound_slack = 1e-6;

using Candidate = std::pair<float, int32_t>;  // (logit, token id)

// The candidates' order: logit descending, ties by lower id. A strict total order (ids are unique),
// so any selection/sort with it yields the same sequence.
struct ByLogit {
  bool operator()(const Candidate& a, const Candidate& b) const {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  }
};

// The best min(k, finite) candidates into `out`, in ByLogit order: a heap of the kept ones,
// worst on top, in one pass.
void top_logits_into(std::span<const float> logits, std::size_t k, std::vector<Candidate>& out) {
  out.clear();
  out.reserve(k);
  const ByLogit better;
  for (std::size_t i = 0; i < logits.size() && k > 0; ++i) {
    const float x = logits[i];
    if (!std::isfinite(x)) continue;
    const Candidate c(x, static_cast<int32_t>(i));
    if (out.size() < k) {
      out.push_back(c);
      std::push_heap(out.begin(), out.end(), better);
    } else if (x >= out.front().first && better(c, out.front())) {
      std::pop_heap(out.begin(), out.end(), better);
      out.back() = c;
      std::push_heap(out.begin(), out.end(), better);
    }
  }
  std::sort_heap(out.begin(), out.end(), better);
}

// 2^(j / 256) for j in [0, 256].
const std::vector<double>& octave_fractions() {
  static const std::vector<double> table = [] {
    std::vector<double> t(k_bins_per_octave + 1);
    for (int j = 0; j <= k_bins_per_octave; ++j) t[static_cast<std::size_t>(j)] = std::exp2(j / double{k_bins_per_octave});
    return t;
  }();
  return table;
}

// The bins of p = e^y below the head: index 0 for p < 2^z_min, index 1 + g for
// 2^(z_min + g/256) <= p < 2^(z_min + (g+1)/256), g < k_grid; z_min = -20 log2(e) - 64, so the
// tail is exactly the indices <= k_tail_top and the middle the ones above.
constexpr std::size_t k_tail_top = static_cast<std::size_t>(k_tail_octaves) * k_bins_per_octave;
constexpr std::size_t k_grid = static_cast<std::size_t>(k_tail_octaves + k_mid_octaves) * k_bins_per_octave;
constexpr double k_z_min = -k_head_depth * k_log2e - k_tail_octaves;

// y: any double <= 0 or -inf. One expression for the scan and load_tail, so both classify alike;
// monotone in y, so the middle precedes the tail in the candidates' order.
std::size_t bin_of(double y) {
  const double t = y * (k_log2e * k_bins_per_octave) + (1.0 - k_z_min * k_bins_per_octave);
  return static_cast<std::size_t>(std::min(static_cast<int64_t>(std::max(t, 0.0)), static_cast<int64_t>(k_grid)));
}

// [lo, hi] around the sum of the p counted in bins[0, end).
std::pair<double, double> bin_bounds(const uint32_t* bins, std::size_t end) {
  const std::vector<double>& frac = octave_fractions();
  double octave_base = std::exp2(k_z_min);  // 2^(z_min + octave), doubled per octave (exact: normal range)
  double lo = 0.0, hi = static_cast<double>(bins[0]) * octave_base;
  for (std::size_t b = 1; b < end; ++b) {
    const std::size_t g = b - 1, j = g % k_bins_per_octave;
    if (g > 0 && j == 0) octave_base *= 2.0;
    if (bins[b] == 0) continue;
    const double count = static_cast<double>(bins[b]);
    lo += count * (octave_base * frac[j]);
    hi += count * (octave_base * frac[j + 1]);
  }
  return {lo * (1.0 - k_bound_slack), hi * (1.0 + k_bound_slack)};
}

double log_sum_exp(std::span<const float> logits, float max_logit) {
  double s = 0.0;
  for (float x : logits) s += std::exp(static_cast<double>(x) - max_logit);
  return std::log(s) + max_logit;
}
}  // namespace

Sampler::Sampler(SamplingParams params)
    : params_(params), rng_(params.seed ? *params.seed : std::random_device{}()) {}

int32_t argmax(std::span<const float> logits) {
  // The first index of the largest non-NaN value, as a scan keeping the first strictly larger one
  // from index 0 gives; a NaN at index 0 wins (nothing compares larger). Two passes: the largest
  // value (NaN never wins a `>`), then the first index holding it (zeros of either sign compare
  // equal, as they never compare larger). With SSE, four lanes of four at a time: bench_sampler's
  // greedy row (151936 logits) took 43 µs p50 on the 2-core dev VM under load, against 68 µs for
  // the four-lane scalar scan it replaces on the same VM idle (and ~80 µs on the H200's host).
  const std::size_t n = logits.size();
  if (n == 0 || std::isnan(logits[0])) return 0;
  const float* x = logits.data();
  float best = x[0];
  std::size_t i = 1;
#if defined(__SSE2__)
  if (n >= 17) {
    __m128 m0 = _mm_set1_ps(best), m1 = m0, m2 = m0, m3 = m0;
    for (; i + 16 <= n; i += 16) {
      // _mm_max_ps(a, b) is a > b ? a : b: a NaN in the row keeps the running maximum.
      m0 = _mm_max_ps(_mm_loadu_ps(x + i), m0);
      m1 = _mm_max_ps(_mm_loadu_ps(x + i + 4), m1);
      m2 = _mm_max_ps(_mm_loadu_ps(x + i + 8), m2);
      m3 = _mm_max_ps(_mm_loadu_ps(x + i + 12), m3);
    }
    alignas(16) float lanes[16];
    _mm_store_ps(lanes, m0);
    _mm_store_ps(lanes + 4, m1);
    _mm_store_ps(lanes + 8, m2);
    _mm_store_ps(lanes + 12, m3);
    for (float v : lanes) best = v > best ? v : best;
  }
#endif
  for (; i < n; ++i) best = x[i] > best ? x[i] : best;
  std::size_t at = 0;
#if defined(__SSE2__)
  const __m128 b4 = _mm_set1_ps(best);
  for (; at + 4 <= n; at += 4)
    if (_mm_movemask_ps(_mm_cmpeq_ps(_mm_loadu_ps(x + at), b4)) != 0) break;
#endif
  while (x[at] != best) ++at;  // ends: best is one of the values
  return static_cast<int32_t>(at);
}

std::vector<std::pair<float, int32_t>> top_logits(std::span<const float> logits, std::size_t k) {
  std::vector<Candidate> out;
  top_logits_into(logits, k, out);
  return out;
}

int32_t Sampler::sample_top(std::span<const std::pair<float, int32_t>> best, int32_t argmax_pick) {
  if (greedy() || params_.top_k <= 0)
    throw std::logic_error("Sampler::sample_top: needs a sampled (not greedy) top_k, got temperature " +
                           std::to_string(params_.temperature) + ", top_k " + std::to_string(params_.top_k));
  if (best.empty()) return argmax_pick;
  const std::size_t n = std::min(best.size(), static_cast<std::size_t>(params_.top_k));
  scratch_.assign(best.begin(), best.begin() + static_cast<std::ptrdiff_t>(n));
  return draw_sorted(1.0 / params_.temperature);
}

bool Sampler::greedy() const { return params_.temperature <= k_greedy_temperature || params_.top_k == 1; }

int32_t Sampler::sample(std::span<const float> logits) {
  if (logits.empty()) return 0;
  if (greedy()) return argmax(logits);

  const double inv_t = 1.0 / params_.temperature;
  scratch_.clear();
  if (params_.top_k > 0 && static_cast<std::size_t>(params_.top_k) < logits.size()) {
    top_logits_into(logits, static_cast<std::size_t>(params_.top_k), scratch_);
    if (scratch_.empty()) return argmax(logits);
    return draw_sorted(inv_t);
  }

  // Candidates are the finite logits: count them and find the largest (four independent chains).
  std::size_t count[4] = {0, 0, 0, 0};
  float most[4];
  std::fill(std::begin(most), std::end(most), -std::numeric_limits<float>::infinity());
  std::size_t at = 0;
  for (; at + 4 <= logits.size(); at += 4) {
    for (std::size_t j = 0; j < 4; ++j) {
      const float x = logits[at + j];
      const bool finite = std::isfinite(x);
      count[j] += finite ? 1 : 0;
      most[j] = (finite && x > most[j]) ? x : most[j];
    }
  }
  for (; at < logits.size(); ++at) {
    const float x = logits[at];
    const bool finite = std::isfinite(x);
    count[0] += finite ? 1 : 0;
    most[0] = (finite && x > most[0]) ? x : most[0];
  }
  const std::size_t n_finite = count[0] + count[1] + count[2] + count[3];
  const float max_logit = std::max(std::max(most[0], most[1]), std::max(most[2], most[3]));
  if (n_finite == 0) return argmax(logits);

  return draw_prefix(logits, n_finite, inv_t, max_logit);
}

int32_t Sampler::draw_sorted(double inv_t) {
  // Softmax of logits / T over the candidates (scratch_, sorted by ByLogit).
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

void Sampler::append_mid() {
  if (mid_appended_) return;
  scratch_.insert(scratch_.end(), mid_.begin(), mid_.begin() + static_cast<std::ptrdiff_t>(mid_size_));
  head_size_ = scratch_.size();
  mid_appended_ = true;
}

void Sampler::load_tail(std::span<const float> logits, double inv_t, double top) {
  if (tail_loaded_) return;
  append_mid();
  for (std::size_t i = 0; i < logits.size(); ++i) {
    const float x = logits[i];
    if (!std::isfinite(x)) continue;
    const double y = x * inv_t - top;
    if (!(y >= -k_quick_depth) && bin_of(y) <= k_tail_top) scratch_.emplace_back(x, static_cast<int32_t>(i));
  }
  tail_loaded_ = true;
}

void Sampler::extend_prefix(std::span<const float> logits, double inv_t, double top, std::size_t hint) {
  if (prefix_ == head_size_) load_tail(logits, inv_t, top);
  // Every head candidate precedes every middle one, and those every tail one (y is monotone in the logit).
  const std::size_t end = prefix_ < head_size_ ? head_size_ : scratch_.size();
  const std::size_t next = std::min(end, std::max({prefix_ + k_first_prefix, prefix_ * k_prefix_growth, hint}));
  const auto first = scratch_.begin() + static_cast<std::ptrdiff_t>(prefix_);
  const auto mid = scratch_.begin() + static_cast<std::ptrdiff_t>(next);
  const auto last = scratch_.begin() + static_cast<std::ptrdiff_t>(end);
  // note: partial_sort (a heap of the kept) is ~4x faster than nth_element + sort when few are kept.
  if (next == end) {
    std::sort(first, last, ByLogit{});
  } else if ((next - prefix_) * 8 <= end - prefix_) {
    std::partial_sort(first, mid, last, ByLogit{});
  } else {
    std::nth_element(first, mid, last, ByLogit{});
    std::sort(first, mid, ByLogit{});
  }
  for (std::size_t i = prefix_; i < next; ++i) probs_.push_back(std::exp(scratch_[i].first * inv_t - top));
  prefix_ = next;
}

int32_t Sampler::draw_full_sort(std::span<const float> logits, double inv_t, double top) {
  load_tail(logits, inv_t, top);
  // scratch_[0, prefix_) already holds the best candidates in order; sort the rest after them.
  std::sort(scratch_.begin() + static_cast<std::ptrdiff_t>(prefix_), scratch_.end(), ByLogit{});
  return draw_sorted(inv_t);
}

int32_t Sampler::draw_prefix(std::span<const float> logits, std::size_t n, double inv_t, float max_logit) {
  // The sorted draw (draw_sorted) over all n candidates, from the sorted prefix it actually reads.
  // It reads the full sum S = p[0] + p[1] + ... + p[n-1] (added in sorted order) only through
  // comparisons that are monotone in S: the top-p cumulative adds fl(p[i] / S) (each nonincreasing
  // in S), and without top-p the draw is r = fl(c * S) for the generator's canonical c. So bracket
  // S in [s_lo, s_hi] without sorting; if the decision is the same at both ends, it is the decision
  // at S (try_decide). First from the head's exact p and bins for the rest; if that does not
  // decide, from the head's and the middle's exact p and bins for the tail (the sorted prefix so
  // far is kept); if that does not decide either (rare), or anything is not finite, sort everything.
  //
  // S and the exact part s are recursive sums of nonnegative doubles, each within gamma_{m-1} =
  // (m-1)u/(1-(m-1)u) of its exact sum (Higham, Accuracy and Stability of Numerical Algorithms,
  // 2nd ed., eq. 4.4); d = 4(n+1)u exceeds gamma plus the rounding of the bracket itself.
  const double top = max_logit * inv_t;  // == the sorted front().first * inv_t (same value)
  prefix_ = 0;
  head_size_ = 0;
  tail_loaded_ = false;
  mid_appended_ = false;
  probs_.clear();
  mid_size_ = 0;
  scratch_.reserve(n);
  if (!std::isfinite(top)) {  // the sorted draw's p are NaN here: replay it on every candidate
    for (std::size_t i = 0; i < logits.size(); ++i) {
      if (std::isfinite(logits[i])) scratch_.emplace_back(logits[i], static_cast<int32_t>(i));
    }
    mid_appended_ = tail_loaded_ = true;
    return draw_full_sort(logits, inv_t, top);
  }
  bins_.assign(k_grid + 1, 0);
  head_bins_.fill(0);
  uint32_t* const bins = bins_.data();
  if (mid_.size() < n) mid_.resize(n);
  Candidate* const mid = mid_.data();
  std::size_t m = 0;
  double s = 0.0;  // the head's p, in index order
  for (std::size_t i = 0; i < logits.size(); ++i) {
    const float x = logits[i];
    if (!std::isfinite(x)) continue;
    const double y = x * inv_t - top;  // <= 0; -inf when x * inv_t overflows
    if (y >= -k_quick_depth) {
      s += std::exp(y);
      scratch_.emplace_back(x, static_cast<int32_t>(i));
      ++head_bins_[std::min(head_bins_.size() - 1, static_cast<std::size_t>(-y * (k_log2e * k_head_bins_per_octave)))];
    } else {  // note: branch-free below: middle vs tail is a coin toss on flat rows
      const std::size_t b = bin_of(y);
      ++bins[b];
      mid[m] = Candidate(x, static_cast<int32_t>(i));
      m += b > k_tail_top ? 1 : 0;
    }
  }
  mid_size_ = m;
  head_size_ = scratch_.size();
  const double d = 4.0 * (static_cast<double>(n) + 1.0) * (std::numeric_limits<double>::epsilon() / 2.0);
  const auto [rest_lo, rest_hi] = bin_bounds(bins, k_grid + 1);
  const double s_lo = (s * (1.0 - d) + rest_lo) * (1.0 - d);
  const double s_hi = (s * (1.0 + d) + rest_hi) * (1.0 + d);
  if (std::isfinite(s_hi) && s_lo > 0.0) {
    if (const auto token = try_decide(logits, n, inv_t, top, s_lo, s_hi, false)) return *token;
  }
  for (std::size_t i = 0; i < m; ++i) s += std::exp(mid[i].first * inv_t - top);
  append_mid();
  const auto [tail_lo, tail_hi] = bin_bounds(bins, k_tail_top + 1);
  const double s2_lo = (s * (1.0 - d) + tail_lo) * (1.0 - d);
  const double s2_hi = (s * (1.0 + d) + tail_hi) * (1.0 + d);
  if (std::isfinite(s2_hi) && s2_lo > 0.0) {
    if (const auto token = try_decide(logits, n, inv_t, top, s2_lo, s2_hi, true)) return *token;
  }
  return draw_full_sort(logits, inv_t, top);
}

std::size_t Sampler::prefix_hint(double mass) const {
  // From the largest p down: count the candidates bin by bin until their lower-edge mass reaches
  // `mass`. Only a size to sort at once instead of growing 256, 1024, ...; any value is correct.
  std::size_t count = 0;
  double lower_mass = 0.0;
  for (std::size_t k = 0; k < head_bins_.size(); ++k) {  // head bin k: p in (2^(-(k+1)/16), 2^(-k/16)]
    if (head_bins_[k] == 0) continue;
    count += head_bins_[k];
    lower_mass += static_cast<double>(head_bins_[k]) * std::exp2(-static_cast<double>(k + 1) / k_head_bins_per_octave);
    if (lower_mass >= mass) return count;
  }
  const uint32_t* const bins = bins_.data();
  const std::vector<double>& frac = octave_fractions();
  double octave_base = std::exp2(k_z_min + static_cast<double>((k_grid - 1) / k_bins_per_octave));
  for (std::size_t g = k_grid; g-- > 0;) {  // grid bin g (index g + 1), top down
    const std::size_t j = g % k_bins_per_octave;
    if (j == k_bins_per_octave - 1 && g + 1 != k_grid) octave_base *= 0.5;  // into the next octave down
    if (bins[g + 1] == 0) continue;
    count += bins[g + 1];
    lower_mass += static_cast<double>(bins[g + 1]) * (octave_base * frac[j]);
    if (lower_mass >= mass) return count;
  }
  return count;
}

std::optional<int32_t> Sampler::try_decide(std::span<const float> logits, std::size_t n, double inv_t, double top,
                                           double s_lo, double s_hi, bool may_load_tail) {
  // Next sorted candidate available? Extends the prefix (the first time at least to `hint`);
  // without may_load_tail, not past the head.
  std::size_t hint = 0;
  const auto available = [&](std::size_t k) {
    if (k < prefix_) return true;
    if (prefix_ == n || (prefix_ == head_size_ && !may_load_tail)) return false;
    extend_prefix(logits, inv_t, top, hint);
    hint = 0;
    return true;
  };
  const double top_p = params_.top_p;
  if (top_p > 0.0 && top_p < 1.0) {
    hint = prefix_hint(top_p * s_hi);
    double cum_lo = 0.0;  // the top-p cumulative with s_hi: <= the one with S
    double cum_hi = 0.0;  // with s_lo: >= the one with S
    std::size_t keep = n;
    for (std::size_t k = 0;; ++k) {
      if (!available(k)) {
        if (k < n) return std::nullopt;  // the head ran out first: not decided here
        break;  // no prefix reaches top_p: keep all, as the sorted draw does
      }
      cum_lo += probs_[k] / s_hi;
      cum_hi += probs_[k] / s_lo;
      if (cum_hi >= top_p) {
        if (!(cum_lo >= top_p)) return std::nullopt;  // S decides
        keep = k + 1;
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
  if (rng_lo != rng_hi) return std::nullopt;  // not one draw's bits each: leave it to the full sort
  hint = prefix_hint(r_hi);
  double acc = 0.0;
  for (std::size_t k = 0;; ++k) {
    if (!available(k)) {
      if (k < n) return std::nullopt;  // the head ran out first: not decided here
      rng_ = rng_lo;  // r >= every partial sum: the sorted draw returns the last candidate
      return scratch_[n - 1].second;
    }
    acc += probs_[k];
    if (r_lo < acc) {
      if (!(r_hi < acc)) return std::nullopt;  // S decides
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
