// Rotary position embedding as a checkpoint describes it: the base (rope_theta), the share of
// each head that rotates (partial_rotary_factor), and the context-extension scaling
// ("rope_scaling" / transformers 5's "rope_parameters"): none or YaRN (Peng et al. 2023,
// arXiv:2309.00071), the one Qwen3 and Qwen3-Coder checkpoints use for contexts beyond their
// pretraining length.
//
// YaRN, as transformers' _compute_yarn_parameters and vLLM's YaRNScalingRotaryEmbedding compute
// it, with d = rotary_dim, L = original_max_position_embeddings, b = rope_theta:
//   pos_freq[i]   = b^(2i/d)                                     i in [0, d/2)
//   extrapolation = 1 / pos_freq[i]            interpolation = 1 / (factor * pos_freq[i])
//   corr(r)       = d * ln(L / (2 pi r)) / (2 ln b)              low = corr(beta_fast), high = corr(beta_slow)
//                   (floor / ceil when truncate), clamped to [0, d - 1]
//   ramp[i]       = clamp((i - low) / (high - low), 0, 1)        (high += 0.001 when equal)
//   inv_freq[i]   = interpolation * ramp[i] + extrapolation * (1 - ramp[i])
// and cos and sin are multiplied by attention_factor (given, else mscale(factor) / mscale(factor,
// mscale_all_dim) when both mscales are given, else mscale(factor) = 0.1 ln(factor) + 1; 1 when
// factor <= 1). `factor` is the config's "factor" (vLLM's reading; a config whose
// max_position_embeddings is not factor x L is read by that field, not by the ratio).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace servedeck::worker {

enum class RopeScalingKind {
  none,  // plain RoPE: inv_freq[i] = b^(-2i/d)
  yarn,
};

std::string_view to_string(RopeScalingKind k);

/// The "rope_scaling" of a config.json, as read.
struct RopeScaling {
  RopeScalingKind kind = RopeScalingKind::none;
  double factor = 1.0;                                // context extension factor (> 0)
  std::int64_t original_max_position_embeddings = 0;  // the pretraining context L (tokens)
  double beta_fast = 32.0;                            // rotations bounding the extrapolated dims
  double beta_slow = 1.0;                             // rotations bounding the interpolated dims
  double attention_factor = 1.0;                      // multiplies cos and sin (resolved at parse)
  bool truncate = true;                               // floor/ceil the correction range
};

/// inv_freq of each rotated pair, rotary_dim / 2 entries in fp32, as transformers builds its
/// buffer: the powers in double rounded to fp32, the YaRN blend in fp32. `rotary_dim` even, >= 2.
std::vector<float> rope_inv_freq(double theta, std::int64_t rotary_dim, const RopeScaling& scaling);

}  // namespace servedeck::worker
