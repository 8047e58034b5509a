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
// sorting the vocabulary: see Sampler::sample.
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
  /// algorithm above, for the same params, generator state and logits; one generator draw per call
  /// unless greedy (temperature <= 1e-5 or top_k == 1: argmax, no draw).
  /// Cost: O(V) (a copy of the finite logits and one exp per entry), plus the sorted prefix the
  /// draw reads: with top_k > 0, a partial sort of top_k; otherwise nth_element + sort of the best
  /// 256, 1024, 4096, ... candidates until the top-p prefix (or, with top_p == 1, the draw) ends
  /// inside it -- usually the first 256 for LM logits; a flat row at top_p 1 may need all of V.
  /// The full sum S is bracketed from an index-order sum; when S's last bits would decide the
  /// token (probability about 1e-10) it falls back to sorting everything.
  int32_t sample(std::span<const float> logits);
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

/// Index of the largest logit (lowest index on ties).
int32_t argmax(std::span<const float> logits);

/// log_softmax(logits)[id] and the `top_n` most likely tokens (top_n may be 0).
TokenLogprob token_logprob(std::span<const float> logits, int32_t id, int top_n);

}  // namespace servedeck::worker
