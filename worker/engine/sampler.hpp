// Sampling one token from a logits row: greedy when temperature is 0, else temperature scaling,
// then top-k, then top-p (nucleus) over the softmax, then a draw from std::mt19937_64. The same
// seed and the same logits give the same tokens. Also the log-softmax used for logprobs (computed
// on the raw logits, as vLLM's default logprobs mode "raw_logprobs").
//
// The definition (what sample() returns) is the sorted algorithm: candidates = the finite logits,
// ordered by logit descending, ties by lower id; with top_k, the first top_k of them; p[i] =
// exp(logit[i] / T - logit[0] / T) in double; S = p[0] + p[1] + ... added in that order; with
// top_p in (0, 1), keep the shortest prefix whose running sum of p[i] / S reaches top_p and set S
// to its p-sum; draw r = uniform_real_distribution(0, S) once; return the first candidate whose
// running p-sum exceeds r (else the last kept). sample() returns exactly that token, without
// sorting the vocabulary: see Sampler::sample. (Relies on IEEE double arithmetic without FMA
// contraction, as in the default ISO C++ build, and on libm's exp being deterministic.)
//
// Not thread-safe: one Sampler per request.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <random>
#include <span>
#include <utility>
#include <vector>

namespace servedeck::worker {

struct SamplingParams {
  double temperature = 1.0;  // <= 1e-5 → greedy
  int top_k = 0;             // <= 0 → all tokens
  double top_p = 1.0;        // (0, 1]; 1 → all
  std::optional<uint64_t> seed;  // absent → seeded from std::random_device
};

/// One token's log-probability and, when asked, the most likely alternatives at its position.
struct TokenLogprob {
  int32_t id = 0;
  float logprob = 0.0f;                          // natural log
  int rank = 1;                                  // 1 + number of tokens with a larger logit
  std::vector<std::pair<int32_t, float>> top;    // (id, logprob), descending; size top_logprobs
};

class Sampler {
 public:
  explicit Sampler(SamplingParams params);
  /// Picks a token id from `logits` (one row, vocab_size V entries, any floats: NaN and +-inf are
  /// never candidates; a row with no finite entry gives argmax). Exactly the token of the sorted
  /// algorithm above (bit for bit: same candidates, order, p, sums and the one draw), for the same
  /// params, generator state and logits; one generator draw per call unless greedy (temperature
  /// <= 1e-5 or top_k == 1: argmax, no draw). Tested against a copy of the old full-sort code.
  ///
  /// Cost: O(V), plus sorting the prefix of candidates the draw reads. With 0 < top_k < V: one
  /// pass keeping a heap of top_k, then sorting those. Otherwise: one pass for the largest logit,
  /// one pass that takes exp() of the "head" (weight p >= e^-10 of the top token's) and counts the
  /// rest in bins of 1/256 octave of p (bounds on S, the full sum of p, without adding it up in
  /// sorted order), then partial_sort / nth_element + sort of the best candidates, growing until
  /// the top-p cut-off (or the draw) is known -- for LM-like rows the first 256 or fewer. If the
  /// bracket on S is too wide to decide, a second try adds the exact p of the "middle" (p down to
  /// about e^-20: one exp() each, most of V on flat rows), keeping the sorted prefix; if S's last
  /// bits would still decide (rare: that bracket is under 1e-6 of S wide, ~1e-10 on LM-like
  /// rows), it sorts everything as before.
  /// Measured (bench/sampler, V = 151936, LM-like rows): ~0.8-1.3 ms vs 16-17 ms for the old
  /// full sort at T 0.7-1.0; a flat row (T = 2, top_p 0.95: most of V in the nucleus) still sorts
  /// most of V, about as slow as before.
  int32_t sample(std::span<const float> logits);
  /// The token sample(row) returns, given only what it reads of the row when top_k is set:
  /// `best` = top_logits(row, top_k) and `argmax_pick` = argmax(row) (taken when `best` is empty:
  /// no finite logit). Requires 0 < top_k and !greedy(); the same generator draw as sample().
  /// Lets a backend select the candidates on its device (Backend::forward_top_k) instead of
  /// copying the row back.
  int32_t sample_top(std::span<const std::pair<float, int32_t>> best, int32_t argmax_pick);
  /// True when sample() is argmax (temperature <= 1e-5 or top_k == 1): no draw, so a backend's
  /// own greedy pick (Backend::forward_greedy) gives the same token.
  bool greedy() const;
  const SamplingParams& params() const { return params_; }

 private:
  using Candidate = std::pair<float, int32_t>;  // (logit, token id)

  // The sorted draw over scratch_ (already sorted, all kept candidates): computes probs_.
  int32_t draw_sorted(double inv_t);
  // Loads the tail, sorts scratch_[prefix_, end) after the sorted prefix, then draw_sorted.
  int32_t draw_full_sort(std::span<const float> logits, double inv_t, double top);
  // The same token as draw_sorted over all n finite candidates, reading only a sorted prefix.
  int32_t draw_prefix(std::span<const float> logits, std::size_t n, double inv_t, float max_logit);
  // The sorted draw's token if it is the same for every S in [s_lo, s_hi] (then draws from rng_),
  // else nullopt (rng_ untouched). Reads past the head only if may_load_tail.
  std::optional<int32_t> try_decide(std::span<const float> logits, std::size_t n, double inv_t, double top, double s_lo,
                                    double s_hi, bool may_load_tail);
  // Grows the sorted prefix scratch_[0, prefix_) (by 256, then 4x, or to `hint`) and its probs_.
  void extend_prefix(std::span<const float> logits, double inv_t, double top, std::size_t hint);
  // About how many of the best candidates hold `mass` (in units of the top token's p), from
  // head_bins_ and bins_; an estimate (sizes the first sort), never a bound.
  std::size_t prefix_hint(double mass) const;
  // Appends the middle candidates (mid_) to scratch_ after the head, once per draw.
  void append_mid();
  // Appends the middle, then the tail candidates (p below ~e^-20), to scratch_, once per draw.
  void load_tail(std::span<const float> logits, double inv_t, double top);
  // One draw r = u(0, sum) from rng_; the first of probs_[0, n) whose running sum exceeds r.
  int32_t walk(double sum, std::size_t n);

  SamplingParams params_;
  std::mt19937_64 rng_;
  // (logit, id) candidates: the head (y >= -10), then the middle (y >= -20) and the tail once
  // appended; y = logit / T - max_logit / T.
  std::vector<Candidate> scratch_;
  std::vector<double> probs_;         // p[i] of scratch_[i], for the sorted prefix
  std::vector<Candidate> mid_;        // [0, mid_size_): the middle candidates, until appended
  std::size_t mid_size_ = 0;
  std::vector<uint32_t> bins_;        // counts of p below the head per 1/256 octave (sampler.cpp)
  std::array<uint32_t, 256> head_bins_{};  // head counts per 1/16 octave of p (prefix_hint only)
  std::size_t prefix_ = 0;            // scratch_[0, prefix_) is sorted and the best
  std::size_t head_size_ = 0;         // scratch_[0, head_size_) is the head (and middle once appended)
  bool tail_loaded_ = false;
  bool mid_appended_ = false;
};

/// Index of the largest logit (lowest index on ties; NaN never wins, except a NaN at index 0,
/// which nothing compares larger than). O(V): two passes, SSE where the target has it.
int32_t argmax(std::span<const float> logits);

/// The min(k, finite count) largest finite logits of `logits` as (logit, id), by logit
/// descending and, on ties, lower id first: the candidates Sampler::sample keeps for top_k = k.
/// NaN and ±inf are never among them. O(V log k).
std::vector<std::pair<float, int32_t>> top_logits(std::span<const float> logits, std::size_t k);

/// log_softmax(logits)[id] and the `top_n` most likely tokens (top_n may be 0).
TokenLogprob token_logprob(std::span<const float> logits, int32_t id, int top_n);

}  // namespace servedeck::worker
