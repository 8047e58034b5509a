// Launchers of the fused decode kernels (batch 1): six launches per MoE layer.
//   1. launch_norm_gemv_bf16: RMSNorm of x computed per block into shared memory, then y = W·x̂
//      (q|k|v concatenated at load → one launch; lm_head with the final norm). When a block's
//      rows fit in shared memory (one block per SM; q|k|v 5120x2048: 39 rows = 156 KB) they are
//      copied there (cp.async by every thread) around griddepcontrol.wait, so they stream during
//      the previous kernel; larger matrices (lm_head), or a device with less shared memory, use
//      one warp per row.
//   2. launch_attention_decode_paged: q/k-norm + RoPE + KV append into the paged pool +
//      split-K attention over it (attention_decode.cu).
//   3. launch_gemv_bf16_pdl, accumulate: o-proj + residual (staged in shared memory as 1.), into
//      the residual stream's other buffer when the router is folded (`res`).
//   4. launch_router_folded: the router's logits times rms from the residual before the o-proj
//      and the attention's output (fold_router_weights), beside the o-proj; or, where the shapes
//      do not allow the fold, launch_router_fused after the o-proj: post-attention norm + router
//      GEMV, the last block's softmax/top-k (by rank).
//   5. launch_moe_gate_up_normed (with 4. folded: every block ranks the logits and normalises x,
//      block 0 writes the ids and routing weights) or launch_moe_gate_up_fused: gate and up rows
//      of the routed experts + SwiGLU.
//   6. launch_moe_down_fused: down rows + weighted fixed-order reduction + residual add; reads
//      ids and copies all of its routed experts' rows into shared memory (192 KB per block for
//      the Qwen3-30B-A3B shape) before griddepcontrol.wait (see its doc).
// After the layers: norm + lm_head (1.), then launch_argmax_row, the greedy pick on the device,
// which also advances the step's epoch (handshakes.cuh).
// pdl: launch with programmatic dependent launch (sm_90 and later; fused_launch.cuh): the kernel
// may be scheduled while its predecessor finishes and waits (griddepcontrol.wait) before touching
// memory, hiding most of the launch gap between consecutive graph nodes. Results are identical
// with or without it. The handshakes that run ahead of that order: handshakes.cuh.
// Conventions as kernels.cuh: bf16 weights row-major (out, in), fp32 activations, bf16 K/V in
// the paged pool (PagedKv), fp32 accumulation; device-side scalars so the step stays graph-capturable (no device→host
// sync); every reduction has a fixed order, so results do not depend on scheduling.
#pragma once

#include <cstdint>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "worker/cuda/handshakes.cuh"
#include "worker/cuda/kernels.cuh"

namespace servedeck::worker::cuda {

/// y = W · (x / rms(x) * norm_w) (+ y when accumulate). W: (out, in) bf16, in % 8 == 0,
/// in <= 12288 (the normalised x lives in shared memory); x: (in) fp32; norm_w: (in) bf16.
/// W and x 16-byte aligned, norm_w 8-byte aligned (std::invalid_argument otherwise).
/// When xn_out is non-null, block 0 also writes the normalised x there (in floats). With pdl and
/// accumulate, y may be read before waiting for the predecessor (as launch_gemv_bf16_pdl).
/// bias: (out) fp32 or null; when set, y = bias + W · x̂ (glm4_moe's q|k|v bias; read before the
/// wait), and accumulate must be false (std::invalid_argument).
void launch_norm_gemv_bf16(const __nv_bfloat16* W, const float* x, const __nv_bfloat16* norm_w, float eps, float* y,
                           int out, int in, bool accumulate, float* xn_out, cudaStream_t stream, bool pdl = false,
                           const float* bias = nullptr);

/// One layer's K and V in the paged KV pool (CudaBackend::allocate_kv_pool), bf16: position p of
/// a sequence lives in pool row table[p / block_tokens] · block_tokens + p % block_tokens, and
/// row r holds one token's n_kv_heads · head_dim values at k + r · kv_dim (V likewise).
struct PagedKv {
  __nv_bfloat16* k = nullptr;
  __nv_bfloat16* v = nullptr;
  const int32_t* table = nullptr;  // device: the sequence's block ids
  int block_tokens = 16;           // rows per pool block, a multiple of 16
};

/// Blocks per KV head of the decode attention at most, and the positions a split covers at
/// least (in units of 16): the split count grows with the context up to attention_splits.
constexpr int k_attention_max_splits = 64;
constexpr int k_attention_min_split_units = 8;

/// Blocks per KV head of launch_attention_decode_paged: enough to give every multiprocessor one
/// block, ceil(SMs / n_kv_heads) (33 for 4 KV heads on 132 SMs), in [1, k_attention_max_splits].
int attention_splits(int n_kv_heads);

/// Shapes and scratch of the decode attention step.
struct AttentionShape {
  int n_heads, n_kv_heads, head_dim, rotary_dim;
  float eps;
  const float* inv_freq;   // device (rotary_dim / 2) table from rope_inv_freq
  int splits;              // blocks per KV head (attention_splits), fixed for a captured graph
  float* scratch;          // device, attention_scratch_floats(n_heads, head_dim, splits)
  unsigned int* counters;  // device, n_kv_heads, zeroed once (H1, handshakes.cuh: each launch leaves them zero)
};

/// Warps per block and shared-memory ring stages per warp of launch_attention_decode_paged for
/// shape `s` on the current device: the first of (12, 2), (8, 2), (12, 1), (8, 1), (4, 2),
/// (4, 1) that the head_dim's kernel allows (12 warps up to head_dim 128, else 8) and whose
/// shared memory fits smem_per_block(); (12, 2) at head_dim 128 takes ~220 KB, so a 99 KB card
/// runs (8, 1). Measured: docs/performance.md, 2026-12-02 "decode attention block".
struct AttentionBlockConfig {
  int warps, stages;
};
AttentionBlockConfig attention_block_config(const AttentionShape& s);

/// Floats of attention scratch: per query head and split, (max, sum, 2 unused, head_dim partial outputs).
inline std::size_t attention_scratch_floats(int n_heads, int head_dim, int splits) {
  return static_cast<std::size_t>(n_heads) * static_cast<std::size_t>(splits) * (static_cast<std::size_t>(head_dim) + 4);
}

/// RoPE inverse frequencies as transformers and the CPU reference compute them:
/// inv_freq[i] = 1 / theta^(fp32(2i / rotary_dim)) (power in double, rounded to fp32).
std::vector<float> rope_inv_freq(float theta, int rotary_dim);

/// Decode attention over the paged KV pool (flash-decoding: split-K partial softmax + combine).
/// qkv: (n_heads + 2 n_kv_heads) · head_dim fp32 = [q | k | v] at position *pos (pre-norm,
/// pre-RoPE). Applies the per-head RMSNorm (q_norm / k_norm, both null to skip) and RoPE at
/// *pos, rounds q, k and v to bf16, writes k and v into pool row *pos of `kv`, and attends over
/// positions [0, *pos] (the block table must cover them). out: (n_heads, head_dim) fp32.
/// Grid: n_kv_heads × s.splits blocks of attention_block_config(s).warps warps. The context is cut into 16-position units;
/// split b of KV head h takes a contiguous run of ceil(units / a) units, a = min(splits,
/// ceil(units / k_attention_min_split_units)) splits in use (the rest exit at once), so the
/// work per block grows with the context and every K/V row is read once per KV head (its GQA
/// group's query heads are the rows of one m16 tile). Each warp streams its units (16 K and V
/// rows of the head) through a ring of shared-memory stages (cp.async; the first stages are
/// issued right after the PDL wait, behind the loads of q|k|v — before it in the head_dim 256
/// instance; rows of earlier steps), computes S = Q·Kᵀ and O += P·V with
/// mma.sync m16n8k16 (bf16 in, fp32 accumulate) and an online softmax in the log2 domain with
/// bf16-rounded P (the flash prefill kernels' numerics, flash_attention.cuh); the block merges
/// its warps, then the last block of a KV head to arrive merges the splits in split order
/// (handshakes.cuh H1). Results do not depend on scheduling.
/// Requirements (std::invalid_argument): head_dim a multiple of 16 in [16, 256], n_heads a
/// multiple of n_kv_heads with a group of at most 16, rotary_dim even in [0, head_dim], q_norm
/// and k_norm both set or both null, scratch and counters set, splits in [1, k_attention_max_splits],
/// kv.k / kv.v 16-byte aligned and kv.table set, kv.block_tokens a positive multiple of 16.
/// With pdl, *pos, the block table, q_norm, k_norm and s.inv_freq (and, at head_dim > 128, the
/// pool rows before *pos) are read BEFORE waiting for the predecessor (none is written by the step's earlier kernels;
/// the host writes *pos and the table before the step). It lets its successor (the o-proj)
/// launch at its start (handshakes.cuh). heads_done (H2): when set, each KV head's merging
/// block adds its group's n_heads / n_kv_heads (release) once their outputs are written.
void launch_attention_decode_paged(const float* qkv, const __nv_bfloat16* q_norm, const __nv_bfloat16* k_norm, const PagedKv& kv,
                                   float* out, const AttentionShape& s, const int32_t* pos, cudaStream_t stream, bool pdl = false,
                                   unsigned int* heads_done = nullptr);

/// Routing outputs and counters of one MoE layer.
struct RouterOutputs {
  float* logits;                    // (n_experts) scratch
  int32_t* ids;                     // (k)
  float* weights;                   // (k)
  unsigned int* done;               // launch_router_fused: one zeroed counter (its last block resets it)
  const uint8_t* hot_flags;         // (n_experts): 1 = VRAM
  unsigned long long* counters;     // [hot hits, misses]
  unsigned long long* layer_counts; // (n_experts) routing counts of this layer
};

/// xn_out = rmsnorm(x) * norm_w; logits = R · xn; then softmax, top-k (ties → lower id),
/// renormalised over the top-k when `renormalise`; counts hits/misses. n_experts <= 1024, k <= 32;
/// R, x, xn_out 16-byte aligned, norm_w 8-byte aligned (std::invalid_argument otherwise).
void launch_router_fused(const __nv_bfloat16* R, const float* x, const __nv_bfloat16* norm_w, float eps, float* xn_out,
                         int n_experts, int hidden, int k, bool renormalise, const RouterOutputs& o, cudaStream_t stream,
                         bool pdl = false);

/// The router folded through the post-attention norm and the o-proj, for launch_router_folded:
/// out (n_experts, hidden + q_dim) fp32, row e = [R[e, :] ⊙ post_norm | (R[e, :] ⊙ post_norm) · Wo].
/// Then R·(x ⊙ post_norm) = out[:, :hidden]·h + out[:, hidden:]·a for x = h + Wo·a: the router's
/// logits before the norm's factor 1/rms(x), from the residual h before the o-proj and the
/// attention's output a. R: (n_experts, hidden) bf16; post_norm: (hidden); Wo: (hidden, q_dim)
/// bf16. The first part is exact (a product of two bf16 in fp32); the second is an fp32 sum in
/// h order. Run once at load (E · (hidden + q_dim) threads; at the benchmark shape a ~1 GFLOP
/// naive fp32 loop per layer, not timed apart from the load).
void fold_router_weights(const __nv_bfloat16* router, const __nv_bfloat16* post_norm, const __nv_bfloat16* o_proj, float* out,
                         int n_experts, int hidden, int q_dim, cudaStream_t stream);

/// The decode step's routing logits without waiting for the o-proj: logits[e] = folded[e, :]·[h | a]
/// (the router's logits times rms(h + Wo·a), see fold_router_weights); the ranking, ids, counters
/// and weights are launch_moe_gate_up_normed's. h: the residual before the o-proj (hidden), a:
/// the attention's output (q_dim). Launched with pdl right after the o-proj, which lets it launch
/// at the o-proj's start: it reads h before any wait (h must be complete when the o-proj starts
/// and not be written by it: the o-proj writes its sum elsewhere, launch_gemv_bf16_pdl's `res`),
/// lets gate/up launch at once, reads a only once sync.heads_done has counted n_heads heads of
/// this step (H2, handshakes.cuh), adds 1 to sync.logits_done per logit written (H3), and its
/// block 0 waits for the o-proj at its end (the grid completes only after the o-proj). The
/// logits are the same sums in the same order on every path. n_experts <= 1024, hidden and q_dim
/// multiples of 4, pointers 16-byte aligned, every sync pointer set (std::invalid_argument).
void launch_router_folded(const float* folded, const float* h, const float* a, int n_experts, int hidden, int q_dim, float* logits,
                          const StepSync& sync, int n_heads, cudaStream_t stream, bool pdl = false);

/// launch_moe_gate_up_fused on xn = rmsnorm(x) ⊙ norm_w computed by every block (x: the residual
/// after the o-proj; its squares summed over the block's 256 threads), for the experts ranked
/// from the folded router's logits o.logits (launch_router_folded): every block waits (before its
/// PDL wait) until sync.logits_done has counted n_experts logits of this step (H3,
/// handshakes.cuh), loads them and ranks them itself (block_topk_by_rank_split: the experts and
/// order of ranking the router's probabilities; ties → lower id). Block 0 writes o.ids and fences
/// them before it triggers the down (H4: the down reads them before its wait), folds o's hit and
/// per-layer counters, and writes o.weights[j] = softmax(logits / rms(x))[ids[j]], divided by
/// their sum over the k picks when `renormalise`. Before its wait it reads nothing but weights,
/// the expert table and the counted logits (the folded router launches it while the o-proj may
/// still run). hidden <= 2048 and a multiple of 8, k <= 32, n_experts in [k, hidden]; x 16-byte
/// and norm_w 8-byte aligned; o's logits, ids, weights, hot_flags and counters and sync's epoch
/// and logits_done set (std::invalid_argument otherwise).
void launch_moe_gate_up_normed(const ExpertTable& table, const float* x, const __nv_bfloat16* norm_w, float eps, int n_experts,
                               int k, bool renormalise, const RouterOutputs& o, const StepSync& sync, float* act,
                               cudaStream_t stream, bool pdl = false);

/// act[j, r] = silu(gate_j[r]·xn) * (up_j[r]·xn), j < k, r < inter. act: (k, inter) fp32.
void launch_moe_gate_up_fused(const ExpertTable& table, const float* xn, const int32_t* ids, int k, float* act,
                              cudaStream_t stream, bool pdl = false);

/// out[h] += sum_{j=0..k-1} weights[j] * (down_j[h, :] · act[j, :]), in an order fixed by the
/// shapes alone (inter <= 768: per expert the lanes' column blocks in order, the warp's
/// reduce-scatter per 8 rows, then the experts in slot order). act 16-byte aligned
/// (std::invalid_argument otherwise).
/// With pdl, `ids` and `out` are read BEFORE waiting for the predecessor (for inter <= 768): they
/// must have been written before the predecessor started, as in the decode step (o-proj writes
/// out, the unfolded router the ids, then gate/up, then down), or written and fenced by gate/up
/// before it triggered (H4, handshakes.cuh). When k·16·inter·2 bytes fit the block's shared
/// memory (at most 200 KB; detail::smem_per_block), each block also copies its 16 rows of every
/// routed expert into shared memory before the wait, so they stream while gate/up finishes; the
/// arithmetic is the same either way (bit-identical results).
void launch_moe_down_fused(const ExpertTable& table, const float* act, const int32_t* ids, const float* weights, int k,
                           float* out, cudaStream_t stream, bool pdl = false);

/// y = W x (+ y when accumulate), as launch_gemv_bf16, launchable with PDL. W: (out, in) bf16,
/// in % 8 == 0, W and x 16-byte aligned. Rows staged in shared memory before the wait when
/// ceil(out / SMs) rows fit the block's shared memory (o-proj 2048x4096: 16 rows = 128 KB per
/// block), copied in 16 paced pieces with at most two in flight per thread, so they do not queue
/// ahead of the attention's loads running beside them; else one warp per row.
/// With pdl and accumulate, the staged kernel reads y BEFORE waiting for the predecessor: y must
/// not be written by the immediate predecessor (in the decode step the o-proj accumulates into
/// the residual stream, last written by the previous layer's down, before q|k|v).
/// With accumulate and `res` set, y = res + W x instead (res read where y would be; y's old value
/// unused): the o-proj writing the residual stream's next buffer (launch_router_folded).
/// trigger_at_start (staged kernel only): lets its successor launch at its start (the folded
/// router, handshakes.cuh) instead of after its wait.
void launch_gemv_bf16_pdl(const __nv_bfloat16* W, const float* x, float* y, int out, int in, bool accumulate,
                          cudaStream_t stream, bool pdl = false, const float* res = nullptr, bool trigger_at_start = false);

/// Blocks of launch_argmax_row at most (its scratch holds one pair per block).
constexpr int k_argmax_blocks = 64;

/// Device scratch of launch_argmax_row: k_argmax_blocks values and indices, and one counter
/// zeroed once (each launch leaves it zero). One scratch must not serve launches that may run at
/// the same time (the decode step's launches are ordered in one stream).
struct ArgmaxScratch {
  float* values;
  int32_t* indices;
  unsigned int* counter;
};

/// *out = the index of the largest of x[0, n) by worker::argmax's rule (sampler.hpp): the lowest
/// index among equal maxima, NaN never picked, and 0 when x[0] is NaN or no value is a number.
/// x 16-byte aligned, n > 0 (std::invalid_argument otherwise). With pdl it waits for the
/// predecessor (lm_head) before reading x. The decode step's greedy pick (CudaBackend::forward_greedy);
/// as the step's last kernel it is given step_epoch (StepSync::epoch), which its last block
/// advances by 1 once everything else of the step has completed (handshakes.cuh).
void launch_argmax_row(const float* x, int n, const ArgmaxScratch& s, int32_t* out, cudaStream_t stream, bool pdl = false,
                       unsigned int* step_epoch = nullptr);

/// Logits per block of launch_top_k_row's first pass, and the largest k it selects.
constexpr int k_top_k_slice = 4096;
constexpr int k_max_device_top_k = 64;

/// Where launch_top_k_row writes (device): k logits and ids, best first, and how many of them
/// are finite (the rest: logit 0, id -1). One allocation in CudaBackend, copied back at once.
struct TopKOut {
  float* logits;
  int32_t* ids;
  int* count;
};

/// Blocks of launch_top_k_row's first pass for a row of n logits (its scratch holds k keys each).
int top_k_blocks(int n);

/// The min(k, finite) best of x[0, n) by top_logits' rule (sampler.hpp: logit descending, lower
/// id first on ties, NaN and ±inf never selected) into `out`; `partial` holds top_k_blocks(n) · k
/// keys. Two kernels in stream order after the row's producer (no PDL). std::invalid_argument
/// when n <= 0, k outside [1, k_max_device_top_k], or top_k_blocks(n) · k above 4096 (the merge's
/// 32 KiB of shared memory).
void launch_top_k_row(const float* x, int n, int k, unsigned long long* partial, const TopKOut& out, cudaStream_t stream);

}  // namespace servedeck::worker::cuda
