// Sampling one token from a logits row: greedy when temperature is 0, else temperature scaling,
// then top-k, then top-p (nucleus) over the softmax, then a draw from std::mt19937_64. The same
// seed and the same logits give the same tokens. Also the log-softmax used for logprobs (computed
// on the raw logits, as vLLM's default logprobs mode "raw_logprobs").
//
// Not thread-safe: one Sampler per request.
#pragma once

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
  /// Picks a token id from `logits` (one row, vocab_size entries).
  int32_t sample(std::span<const float> logits);
  const SamplingParams& params() const { return params_; }

 private:
  SamplingParams params_;
  std::mt19937_64 rng_;
  std::vector<std::pair<float, int32_t>> scratch_;
};

/// Index of the largest logit (lowest index on ties).
int32_t argmax(std::span<const float> logits);

/// log_softmax(logits)[id] and the `top_n` most likely tokens (top_n may be 0).
TokenLogprob token_logprob(std::span<const float> logits, int32_t id, int top_n);

}  // namespace servedeck::worker
