// What a request asks to change in each logits row before its token is sampled: OpenAI's
// logit_bias, presence_penalty and frequency_penalty, and vLLM's repetition_penalty. Applied in
// vLLM's order (its v1 sampler): the bias first, then the repetition penalty over the prompt's
// and the generated tokens, then the frequency and presence penalties over the generated tokens.
// Logprobs stay those of the raw row (vLLM's default "raw_logprobs"): the engine samples from an
// adjusted copy.
//
// Formulas, for a token j with c_j generated occurrences so far:
//   logit_bias:          l_j += bias_j                                    (OpenAI, vLLM)
//   repetition_penalty:  l_j = l_j > 0 ? l_j / r : l_j * r, when j occurs in the prompt or the
//                        output (CTRL, Keskar et al. 2019, as transformers and vLLM apply it)
//   frequency, presence: l_j -= c_j · frequency + (c_j > 0) · presence   (OpenAI's definition)
// Not thread-safe: one LogitsAdjuster per request.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

namespace servedeck::worker {

/// A request's logits changes; the defaults change nothing.
struct LogitsAdjust {
  std::vector<std::pair<int32_t, float>> bias;  // (token id, added to its logit), ids >= 0
  float presence_penalty = 0.0f;                 // [-2, 2]
  float frequency_penalty = 0.0f;                // [-2, 2]
  float repetition_penalty = 1.0f;               // > 0; 1 → none
  /// True when applying it changes a row (a bias or a penalty other than the neutral value).
  bool active() const;
};

class LogitsAdjuster {
 public:
  /// `vocab`: the width of a logits row; every bias id must be below it (Engine::check refuses
  /// the request otherwise). `prompt`: the request's token ids (the repetition penalty's set).
  LogitsAdjuster(const LogitsAdjust& adjust, std::span<const int32_t> prompt, std::size_t vocab);
  /// Records a generated token (any id; ids outside [0, vocab) are not counted).
  void push(int32_t token);
  /// Applies the changes to `row` (vocab entries) in place. O(bias entries + distinct tokens seen).
  void apply(std::span<float> row) const;

 private:
  LogitsAdjust adjust_;
  std::vector<uint32_t> count_;     // vocab: generated occurrences
  std::vector<uint8_t> seen_;       // vocab: in the prompt or generated (repetition penalty)
  std::vector<int32_t> seen_ids_;   // the ids with seen_ set, each once
  std::vector<int32_t> output_ids_; // the ids with count_ > 0, each once
};

}  // namespace servedeck::worker
