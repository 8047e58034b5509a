// Launchers of the prefill-chunk kernels (n tokens at once). The dense projections and the
// expert GEMMs of a chunk go through cuBLAS (bf16 in, fp32 out, fp32 compute); these kernels do
// the element-wise and per-row work between them. Activations that feed a GEMM are bf16; the
// K/V pool is bf16 (PagedKv, fused.cuh); the residual stream and every reduction stay fp32. All reductions have a fixed order.
#pragma once

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "worker/cuda/fused.cuh"

namespace servedeck::worker::cuda {

/// x[r, :] = table[tokens[r], :] as fp32, r < rows. tokens: device int32 (rows).
void launch_embed_rows(const __nv_bfloat16* table, const int32_t* tokens, float* x, int rows, int hidden,
                       cudaStream_t stream);

/// y[r, :] = bf16(x[r, :] / rms(x[r, :]) * w). x: (rows, dim) fp32, y: (rows, dim) bf16; when
/// y32 is non-null the fp32 values are written there too.
void launch_rmsnorm_rows_bf16(const float* x, const __nv_bfloat16* w, __nv_bfloat16* y, int rows, int dim, float eps,
                              cudaStream_t stream, float* y32 = nullptr);

/// Router logits with fp32 activations, as the decode path computes them (a bf16-rounded input
/// flips near-tied top-k choices): logits (rows, n_experts) = xn (rows, hidden) · Rᵀ, fp32
/// accumulation. When hidden is a multiple of 32, a tiled kernel (64 rows × 64 experts per block)
/// that reads R once per 64 rows, for any row count (R and xn then 16-byte aligned, else
/// std::invalid_argument); otherwise one block per row.
void launch_router_logits_rows(const __nv_bfloat16* R, const float* xn, float* logits, int rows, int n_experts, int hidden,
                               cudaStream_t stream);

/// qkv: (rows, (n_heads + 2 n_kv_heads) head_dim) fp32 of tokens at positions pos0 + r. In
/// place: per-head q/k RMSNorm (both null to skip) and RoPE; then writes k and v of each row,
/// rounded to bf16, into the pool row of position pos0 + r (kv's block table must cover it).
/// head_dim <= 256. bias: ((n_heads + 2 n_kv_heads) head_dim) fp32 or null; when set it is added
/// to q and k before their norm and RoPE and to v as it is written (q of the rows in qkv then
/// carries it; their v part does not).
void launch_qk_rope_append_rows(float* qkv, const __nv_bfloat16* q_norm, const __nv_bfloat16* k_norm, const PagedKv& kv,
                                const AttentionShape& s, int rows, int pos0, cudaStream_t stream, const float* bias = nullptr);

/// k_out / v_out row p = the pool's K / V row of position p (kv's block table), p < rows: the
/// contiguous copy of a layer's context the prefill attention reads (bf16 for the flash kernel,
/// fp32 for the cuBLAS path; bf16 → fp32 is exact). kv_dim a multiple of 8; the pool and the
/// outputs 16-byte aligned (std::invalid_argument otherwise).
void launch_gather_kv_rows(const PagedKv& kv, int kv_dim, int rows, __nv_bfloat16* k_out, __nv_bfloat16* v_out, cudaStream_t stream);
void launch_gather_kv_rows(const PagedKv& kv, int kv_dim, int rows, float* k_out, float* v_out, cudaStream_t stream);

/// In place over scores (rows, ld) fp32 with row r = (head-in-batch, query i): row r covers keys
/// [0, len); keys t > pos0 + i are masked; softmax over the rest (fixed-order block reduction).
/// `queries` = rows per head (i = r % queries).
void launch_causal_softmax_rows(float* scores, int rows, int queries, int len, int ld, int pos0_first_query,
                                cudaStream_t stream);

/// y = bf16(x), n elements.
void launch_to_bf16(const float* x, __nv_bfloat16* y, std::size_t n, cudaStream_t stream);

/// Router for rows: softmax over logits (rows, n) then top-k (ties → lower id), renormalised
/// when asked; ids/weights (rows, k). Counts routes like the decode router. n <= 1024, k <= 32.
void launch_router_topk_rows(const float* logits, int rows, int n, int k, bool renormalise, int32_t* ids, float* weights,
                             const uint8_t* hot_flags, unsigned long long* counters, unsigned long long* layer_counts,
                             cudaStream_t stream);

/// The MoE rows in expert order: for p < rows (p = t·k + j), at = offset[ids[p]] + rank[p],
/// slot[p] = at and src[at] = t. ids: device; rank (rows) and offset (n_experts) may be mapped
/// host memory (read once per row / once per block). n_experts <= 4096; ids in [0, n_experts)
/// and every `at` in [0, rows) (a permutation: the caller's ranks and offsets).
void launch_moe_scatter_rows(const int32_t* ids, const int32_t* rank, const int32_t* offset, int rows, int k, int n_experts,
                             int32_t* slot, int32_t* src, cudaStream_t stream);

/// xp[p, :] = x[src[p], :], p < rows; bf16 rows of `dim`.
void launch_gather_rows_bf16(const __nv_bfloat16* x, const int32_t* src, __nv_bfloat16* xp, int rows, int dim,
                             cudaStream_t stream);

/// act[p, i] = bf16(silu(gu[p, i]) * gu[p, inter + i]); gu: (rows, 2 inter) fp32.
void launch_swiglu_rows_bf16(const float* gu, __nv_bfloat16* act, int rows, int inter, cudaStream_t stream);

/// x[t, :] += sum_{j=0..k-1} weights[t, j] * partial[slot[t, j], :], in that order (one
/// reduction per token, fp32). partial: (rows*k, hidden) fp32; slot, weights: (rows, k).
void launch_moe_reduce_rows(const float* partial, const int32_t* slot, const float* weights, int rows, int k, int hidden,
                            float* x, cudaStream_t stream);

}  // namespace servedeck::worker::cuda
