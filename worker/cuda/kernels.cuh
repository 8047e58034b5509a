// Launchers of the CUDA kernels used by the decode path (batch 1). Kernels live in the .cu
// files named after each op; this header declares only launchers. Every launcher checks its
// shape and alignment preconditions (throwing std::invalid_argument naming the argument and
// both values), launches on `stream`, then checks cudaGetLastError().
//
// Conventions: weights bf16, row-major (out, in) as in Hugging Face checkpoints; activations and
// the KV cache fp32; accumulation fp32. Device-side scalars (position, sequence length) are read
// from device memory so a decode step can be captured in a CUDA graph and replayed.
#pragma once

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

namespace servedeck::worker::cuda {

/// y[r, :] = x[r, :] / rms(x[r, :]) * w, for r in [0, rows). x, y: (rows, dim) fp32; w: (dim) bf16.
/// In place allowed (x == y).
void launch_rmsnorm(const float* x, const __nv_bfloat16* w, float* y, int rows, int dim, float eps,
                    cudaStream_t stream);

/// y = W x (+ y when accumulate). W: (out, in) bf16 row-major, 16-byte aligned rows (in % 8 == 0);
/// x: (in) fp32; y: (out) fp32. One warp per output row, 16-byte loads. W may be a UVA pointer
/// to pinned host memory (reads then cross PCIe).
void launch_gemv_bf16(const __nv_bfloat16* W, const float* x, float* y, int out, int in, bool accumulate,
                      cudaStream_t stream);

/// x = table[*token] as fp32. table: (vocab, hidden) bf16; token: device int32.
void launch_embed(const __nv_bfloat16* table, const int32_t* token, float* x, int hidden, cudaStream_t stream);

/// Rotary embedding (Hugging Face rotate_half convention) on q (n_heads, head_dim) and
/// k (n_kv_heads, head_dim) at position *pos, over the first `rotary_dim` of each head.
void launch_rope(float* q, float* k, int n_heads, int n_kv_heads, int head_dim, int rotary_dim, const int32_t* pos,
                 float theta, cudaStream_t stream);

/// Writes k and v (n_kv_heads*head_dim each) into the caches at row *pos.
/// Caches: (max_len, n_kv_heads*head_dim) fp32.
void launch_kv_append(const float* k, const float* v, float* k_cache, float* v_cache, const int32_t* pos, int kv_dim,
                      cudaStream_t stream);

/// Single-query causal attention over rows [0, *pos] of the caches, GQA (n_heads / n_kv_heads
/// query heads share a KV head), scale 1/sqrt(head_dim). q, out: (n_heads, head_dim);
/// scores: (n_heads, max_len) fp32 scratch. head_dim <= 256.
void launch_attention_decode(const float* q, const float* k_cache, const float* v_cache, float* scores, float* out,
                             int n_heads, int n_kv_heads, int head_dim, const int32_t* pos, int max_len,
                             cudaStream_t stream);

/// Router: softmax over logits (n_experts), top-k ids and weights (renormalised over the top-k
/// when `renormalise`, as Qwen3-MoE's norm_topk_prob). Ties break to the lower id. n_experts <= 1024.
void launch_router_topk(const float* logits, int n_experts, int k, bool renormalise, int32_t* ids, float* weights,
                        cudaStream_t stream);

/// The decode step's top-k by rank on one block of 256 threads (router_select.cuh):
/// block_topk_by_rank_split when `split` (gate/up's, the default), else block_topk_by_rank (the
/// router's last block's). ids[r], vals[r] for r < k: the r-th largest of p[0..n) (NaN ranked as
/// -inf, ties → lower id). n in (0, 1024], k in (0, min(n, 32)] (std::invalid_argument otherwise).
/// For tests: both must pick the same experts in the same order.
void launch_block_topk_by_rank(const float* p, int n, int k, bool split, int32_t* ids, float* vals, cudaStream_t stream);

/// How an expert block stores its weights (worker/cuda/quant_layout.cuh gives the byte layout):
/// bf16, or as the checkpoint shipped them (FP8 block-scaled, NVFP4).
enum class ExpertFormat : int { bf16 = 0, fp8_block = 1, nvfp4 = 2 };

/// Pointer table of one MoE layer: for expert e, `experts[e]` points at its weight block
/// [gate (inter, hidden); up (inter, hidden); down (hidden, inter)] (bf16; quantised formats:
/// the three weights as stored, then their scales, quant_layout.cuh), in VRAM (hot-expert cache)
/// or pinned host memory (UVA). The table lives in device memory: selecting an expert needs no
/// device→host sync. The bf16 kernels (launch_moe_decode, the fused ones) read bf16 tables only.
struct ExpertTable {
  const __nv_bfloat16* const* experts;  // (n_experts) device array of pointers
  int hidden;
  int inter;
  ExpertFormat format = ExpertFormat::bf16;
  int block_rows = 128;  // fp8_block: rows and columns one scale covers
  int block_cols = 128;
};

/// Routed-expert MLP for one token: out += sum_j weights[j] * down_j(silu(gate_j x) * up_j x),
/// j over the k routed experts, reduced once in a fixed order (j = 0..k-1) so results do not
/// depend on scheduling. scratch: (k, 2*inter) fp32; partial: (k, hidden) fp32. hidden % 8 == 0, inter % 8 == 0.
void launch_moe_decode(const ExpertTable& table, const float* x, const int32_t* ids, const float* weights, int k,
                       float* scratch, float* partial, float* out, cudaStream_t stream);

/// x += y, n elements.
void launch_add(float* x, const float* y, int n, cudaStream_t stream);

/// SwiGLU for the dense MLP: h[i] = silu(g[i]) * u[i], n elements.
void launch_swiglu(const float* g, const float* u, float* h, int n, cudaStream_t stream);

}  // namespace servedeck::worker::cuda
