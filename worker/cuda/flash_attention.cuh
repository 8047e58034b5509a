// Causal prefill attention on tensor cores, flash-style: each block streams key/value tiles of
// the KV cache through shared memory and keeps a running (max, sum) softmax per query row, so
// the (queries × keys) score matrix never reaches device memory (Dao et al., "FlashAttention",
// 2022, online softmax of Milakov & Gimelshein 2018).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

namespace servedeck::worker::cuda {

/// True when launch_flash_attention_prefill handles this shape: head_dim 32, 64 or 128 and
/// n_heads a multiple of n_kv_heads with n_heads / n_kv_heads <= 8 (one warp per query head of a group).
bool flash_attention_supported(int n_heads, int n_kv_heads, int head_dim);

/// out[i, h·hd : (h+1)·hd] = softmax_j(q_i,h · k_j / sqrt(hd)) · v_j over keys j in [0, pos0 + i],
/// for chunk rows i < n (query i sits at position pos0 + i) and query heads h < n_heads; KV head
/// of h = h / (n_heads / n_kv_heads) (GQA).
///   q: (n, ldq) fp32, head h of row i at q + i·ldq + h·hd (already q-normed and rotated);
///   k, v: (>= pos0 + n, n_kv_heads·hd) bf16, rows [0, pos0 + n) written (the prefill path
///         rounds the layer's fp32 cache rows into a bf16 copy before the launch);
///   out: (n, ldo) fp32.
/// Numerics are those of a bf16 engine (FlashAttention-2, transformers in bf16): q is rounded to
/// bf16, S = Q·Kᵀ and O = P·V run on bf16 tensor cores (mma.sync m16n8k16) with fp32
/// accumulation, the probabilities P are bf16 (relative rounding 2^-9) and the running sum adds
/// the rounded values, so each row's weights sum to exactly what multiplies v; the running max
/// and sum and the output stay fp32. Against fp32 attention a score moves by up to ~2^-8 of
/// |q|·|k|: on a peaked softmax that moves probabilities by percent (flash_attention_test.cpp,
/// backend_test.cpp state the measured sizes); the cuBLAS path (TF32 on the fp32 cache) is the
/// closer one.
/// One block per (16 queries, KV head) with one warp per query head of the group.
/// Throws std::invalid_argument when !flash_attention_supported, n_kv_heads > 65535, n <= 0,
/// pos0 < 0, ldq/ldo odd or shorter than n_heads · head_dim, k/v not 16-byte aligned, or
/// q/out not 8-byte aligned.
void launch_flash_attention_prefill(const float* q, int ldq, const __nv_bfloat16* k, const __nv_bfloat16* v, float* out,
                                    int ldo, int n, int pos0, int n_heads, int n_kv_heads, int head_dim, cudaStream_t stream);

}  // namespace servedeck::worker::cuda
