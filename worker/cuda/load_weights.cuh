// Weight conversion for the CUDA backend's loader (internal to worker/cuda; load_weights.cu).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "worker/cuda/quant_layout.cuh"
#include "worker/model/checkpoint.hpp"

namespace servedeck::worker::cuda::detail {

/// fp32 → bf16 bits, round to nearest even (NaN → 0x7fc0).
uint16_t f32_to_bf16_bits(float f);
/// bf16 bits → fp32 (exact).
float bf16_bits_to_f32(uint16_t b);
/// IEEE half bits → fp32 (exact).
float f16_bits_to_f32(uint16_t h);

/// Converts a checkpoint tensor to bf16 into `dst` (element count must match); a quantised
/// weight is dequantised (fp32, then rounded to bf16). Throws std::runtime_error naming the
/// tensor and both counts.
void to_bf16(const WeightRef& t, uint16_t* dst, std::size_t count);

/// Converts an unquantised checkpoint tensor (BF16/F16/F32) to fp32 into `dst` (element count
/// must match): the biases, kept in fp32 as the CPU backend widens them. Throws
/// std::runtime_error for a missing, mis-sized or quantised tensor.
void to_f32(const WeightRef& t, float* dst, std::size_t count);

/// Writes matrix m (0 gate, 1 up, 2 down) of a quantised expert block from the checkpoint's
/// stored tensors (layout: quant_layout.cuh). Preconditions: q has the layout's format.
void write_quantised(const QuantLayout& L, int m, const QuantizedWeight& q, std::byte* block);

/// Quantises fp32 matrix m (rows x cols) of an expert into block (layout L), as the published
/// quantisers do (worker/model/quantize.hpp): the benchmark's synthesised experts.
void quantise_into(const QuantLayout& L, int m, const float* w, int rows, int cols, std::byte* block);

/// Deterministic uniform bf16 in [-scale, scale] (splitmix64), for synthetic weights.
void fill_random(uint16_t* dst, std::size_t count, uint64_t seed, float scale);

/// Folds YaRN's attention factor m (the CPU's scale on cos and sin, worker/cpu/ops.hpp rope) into
/// the weights that feed the rotated dims [0, rotary) of every q and k head, so that the decode
/// and prefill kernels' RoPE on plain cos/sin gives m times the rotation, as the CPU does. With
/// QK-norm (q_norm and k_norm set: (head_dim) bf16 each) the norm weights' entries [0, rotary)
/// are scaled (rounded again to bf16: a relative change of at most 2^-9 against the CPU's fp32
/// product); without it the q and k rows whose in-head index is below `rotary` of qkv
/// ((q_dim + 2 kv_dim, hidden) bf16, rounded again) and of qkv_bias (fp32, when set). RoPE is
/// linear, so rotating m·x is m times rotating x; the pass-through dims keep factor 1.
void fold_yarn_scale(float m, int head_dim, int rotary, int q_dim, int kv_dim, std::size_t hidden, uint16_t* qkv,
                     std::vector<float>* qkv_bias, uint16_t* q_norm, uint16_t* k_norm);

}  // namespace servedeck::worker::cuda::detail
