// fp32 building blocks of the CPU reference forward pass. Weights are read in their stored
// dtype (BF16/F16/F32) straight from the checkpoint's mmap and widened to fp32 per row.
//
// Thread-safety: the functions are pure over their arguments; matmul() spreads rows over up to
// `threads` std::threads it starts and joins itself.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cmath>
#include <cstring>
#include <functional>

#include "worker/model/safetensors.hpp"

namespace servedeck::worker::cpu {

/// bf16 bits → fp32 (exact).
inline float bf16_to_f32(std::uint16_t b) {
  const std::uint32_t u = static_cast<std::uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

/// fp32 → bf16 bits, rounded to nearest even (as torch's .to(torch.bfloat16) and CUDA's
/// __float2bfloat16_rn); a NaN stays a (quiet) NaN, infinities stay infinite.
inline std::uint16_t f32_to_bf16(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>(u >> 16);
}

/// Widens `count` elements starting at element `offset` of `w` (BF16, F16 or F32) into `out`.
/// Throws std::logic_error for a quantised dtype (F8_E4M3, U8): those are dequantised at load.
void to_f32(const TensorRef& w, std::size_t offset, std::size_t count, float* out);

/// Runs fn(begin, end) over [0, n) split into up to `threads` contiguous chunks (one per thread,
/// the calling thread takes the first), using at most one thread per ~64K of `work` (a cost
/// estimate in multiply-adds): below that, starting a thread costs more than it saves.
void parallel_for(std::size_t n, std::size_t threads, std::size_t work,
                  const std::function<void(std::size_t, std::size_t)>& fn);

/// y = x @ w^T. w: (out_features, in_features) BF16, F16 or F32; x: (n, in_features) fp32 row-major;
/// y: (n, out_features) fp32, overwritten. Each weight row is widened once and dotted with all n
/// rows of x. Rows of w are split over `threads`.
void matmul(const TensorRef& w, const float* x, std::size_t n, float* y, std::size_t threads);

/// Dot product of two fp32 vectors (8 partial sums).
float dot(const float* a, const float* b, std::size_t n);

/// RMSNorm over each of `rows` rows of width `dim` (transformers Qwen3RMSNorm, fp32):
/// y = x / sqrt(mean(x^2) + eps) * weight. In place allowed (y == x).
void rms_norm(const float* x, const float* weight, std::size_t rows, std::size_t dim, double eps, float* y);

/// RoPE, rotate_half convention on the first `rotary_dim` dimensions of each head
/// (transformers apply_rotary_pos_emb; the rest pass through, as with partial_rotary_factor):
/// for i < r = rotary_dim / 2, with angle a_i = pos * inv_freq[i] (fp32, as transformers forms it)
///   x'[i]     = (x[i] cos a_i - x[i + r] sin a_i) * scale
///   x'[i + r] = (x[i + r] cos a_i + x[i] sin a_i) * scale
/// in place on `heads` heads of `head_dim`. `inv_freq` has rotary_dim / 2 entries
/// (rope_inv_freq, worker/model/rope.hpp); `scale` is YaRN's attention factor (1 otherwise),
/// applied to cos and sin as transformers does (the pass-through dims are not scaled).
void rope(float* x, std::size_t heads, std::size_t head_dim, std::size_t rotary_dim, std::int64_t pos,
          const float* inv_freq, float scale = 1.0f);

/// silu(x) = x / (1 + exp(-x)).
inline float silu(float x) { return x / (1.0f + std::exp(-x)); }

}  // namespace servedeck::worker::cpu
