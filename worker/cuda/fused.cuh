// Launchers of the fused decode kernels (batch 1): six launches per MoE layer instead of ~17.
//   1. launch_norm_gemv_bf16: RMSNorm of x computed per block into shared memory, then y = W·x̂
//      (q|k|v concatenated at load → one launch; the router; lm_head with the final norm). When
//      a block's rows fit in shared memory (one block per SM; q|k|v 5120x2048: 39 rows = 156 KB)
//      they are copied there (cp.async by every thread) before griddepcontrol.wait, so they stream during the
//      previous kernel; larger matrices (lm_head) use one warp per row.
//   2. launch_attention_decode_fused: q/k-norm + RoPE + KV append + single-query attention.
//   3. launch_gemv_bf16_pdl, accumulate: o-proj + residual (staged in shared memory as 1.), into
//      the residual stream's other buffer when the router is folded (`res`).
//   4. launch_router_folded (default): the router's logits times rms from the residual before the
//      o-proj and the attention's output (fold_router_weights), beside the o-proj; the last block
//      ranks them and folds the routing hit counters. Or launch_router_fused after the o-proj:
//      post-attention norm + router GEMV, the last block's softmax/top-k (by rank). With the
//      early routing (fused_launch.cuh) launched at the o-proj's start, waiting for the
//      attention's heads by a count; with gate/up ranks (the default) no last block: its blocks
//      count their logits.
//   5. launch_moe_gate_up_normed (with 4. folded: every block normalises x, block 0 writes the
//      routing weights) or launch_moe_gate_up_fused: gate and up rows of the routed experts + SwiGLU.
//      With the early ids (fused_launch.cuh) its first rows loaded before its PDL wait; with
//      gate/up ranks every block ranks the counted logits itself and block 0 writes the ids.
//   6. launch_moe_down_fused: down rows + weighted fixed-order reduction + residual add; reads
//      ids and copies all of its routed experts' rows into shared memory (192 KB per block for
//      the Qwen3-30B-A3B shape) before griddepcontrol.wait (see its doc).
// After the layers: norm + lm_head (1.), then launch_argmax_row, the greedy pick on the device.
// pdl: launch with programmatic dependent launch (Hopper): the kernel may be scheduled while
// its predecessor finishes and waits (griddepcontrol.wait) before touching memory, hiding most
// of the launch gap between consecutive graph nodes. Results are identical with or without it.
// Conventions as kernels.cuh: bf16 weights row-major (out, in), fp32 activations and KV cache,
// fp32 accumulation; device-side scalars so the step stays graph-capturable (no device→host
// sync); every reduction has a fixed order, so results do not depend on scheduling.
#pragma once

#include <cstdint>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "worker/cuda/kernels.cuh"

namespace servedeck::worker::cuda {

/// y = W · (x / rms(x) * norm_w) (+ y when accumulate). W: (out, in) bf16, in % 8 == 0,
/// in <= 12288 (the normalised x lives in shared memory); x: (in) fp32; norm_w: (in) bf16.
/// W and x 16-byte aligned, norm_w 8-byte aligned (std::invalid_argument otherwise).
/// When xn_out is non-null, block 0 also writes the normalised x there (in floats). With pdl and
/// accumulate, y may be read before waiting for the predecessor (as launch_gemv_bf16_pdl).
void launch_norm_gemv_bf16(const __nv_bfloat16* W, const float* x, const __nv_bfloat16* norm_w, float eps, float* y,
                           int out, int in, bool accumulate, float* xn_out, cudaStream_t stream, bool pdl = false);

/// Blocks per query head in the fused decode attention (split over positions). Measured on
/// the H200 (bench/moe_offload/results-2026-11-29-h200-session4.txt, run 7; 32/4 heads of 128,
/// 8 warps per block): 8 splits against 4 take the attention from 9.5 to 8.3 µs alone and the
/// layer sequence from 66.9 to 62.9 µs at position 255; at position 4095, 76.5 → 44.2 µs alone
/// and 197.7 → 124.7 µs in the sequence. 2, 16 and 32 splits and 4 warps per block were slower.
constexpr int k_attention_splits = 8;

/// Shapes and scratch of the fused attention step.
struct AttentionShape {
  int n_heads, n_kv_heads, head_dim, rotary_dim;
  float eps;
  const float* inv_freq;   // device (rotary_dim / 2) table from rope_inv_freq
  int max_len;             // KV cache rows
  float* scratch;          // device, attention_scratch_floats(n_heads, head_dim)
  unsigned int* counters;  // device, n_heads, zeroed once (each launch leaves them zero)
};

/// Floats of attention scratch: per head and split, (max, sum, head_dim partial outputs).
inline std::size_t attention_scratch_floats(int n_heads, int head_dim) {
  return static_cast<std::size_t>(n_heads) * k_attention_splits * (static_cast<std::size_t>(head_dim) + 2);
}

/// RoPE inverse frequencies as transformers and the CPU reference compute them:
/// inv_freq[i] = 1 / theta^(fp32(2i / rotary_dim)) (power in double, rounded to fp32).
std::vector<float> rope_inv_freq(float theta, int rotary_dim);

/// qkv: (n_heads + 2 n_kv_heads) * head_dim fp32 = [q | k | v] at position *pos (pre-norm,
/// pre-RoPE). Applies per-head RMSNorm (q_norm/k_norm, both null to skip), RoPE at *pos,
/// writes k and v into the caches' row *pos, then attends over rows [0, *pos]. out: (n_heads,
/// head_dim). head_dim <= 256. With pdl, *pos, q_norm, k_norm and s.inv_freq are read BEFORE
/// waiting for the predecessor: *pos must not be written by it (in the decode step the host
/// copies it before the step). With pdl it lets its successor (the o-proj) launch at its start
/// unless SERVEDECK_ATTN_EARLY_TRIGGER=0 (fused_launch.cuh: the successor may then read only what
/// was complete before this kernel's predecessor passed its wait).
/// heads_done (the early routing, fused_launch.cuh): when set, each head's merging block adds 1
/// to it (release) once the head's output is written; the folded router that waits for it clears it.
void launch_attention_decode_fused(const float* qkv, const __nv_bfloat16* q_norm, const __nv_bfloat16* k_norm,
                                   float* k_cache, float* v_cache, float* out, const AttentionShape& s,
                                   const int32_t* pos, cudaStream_t stream, bool pdl = false, unsigned int* heads_done = nullptr);

/// Routing outputs and counters of one MoE layer.
struct RouterOutputs {
  float* logits;                    // (n_experts) scratch
  int32_t* ids;                     // (k)
  float* weights;                   // (k)
  unsigned int* done;               // one zeroed counter (reset by the kernel itself)
  const uint8_t* hot_flags;         // (n_experts): 1 = VRAM
  unsigned long long* counters;     // [hot hits, misses]
  unsigned long long* layer_counts; // (n_experts) routing counts of this layer
  unsigned int* ids_ready = nullptr; // launch_router_folded only: set to 1 once ids are written
                                     // (the early-ids handshake, fused_launch.cuh), or nullptr
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

/// The decode step's routing without waiting for the o-proj: o.logits[e] = folded[e, :]·[h | a]
/// (the router's logits times rms(h + Wo·a), see fold_router_weights), then the top-k of those
/// by rank (the experts and order of ranking the router's probabilities — the positive factor
/// changes no order — up to fp32 rounding; ties → lower id), o.ids and the hit/miss and
/// per-layer counters as launch_router_fused; o.weights is NOT written (launch_moe_gate_up_normed
/// writes it once the norm's factor is known). h: the residual before the o-proj (hidden), a:
/// the attention's output (q_dim). Launched with pdl right after the o-proj, it reads h and a
/// before its wait — they must be complete when the o-proj passes its own wait (h written three
/// launches back or earlier and not by the o-proj, which must write its sum elsewhere:
/// launch_gemv_bf16_pdl's `res`) — lets its successor launch at once, and waits for the o-proj
/// at its end. n_experts <= 1024, k <= 32, hidden and q_dim multiples of 4, pointers 16-byte
/// aligned.
/// heads_done (the early routing, fused_launch.cuh): when set, a is not complete at launch (the
/// o-proj before it triggers at its start): every block computes h's part of its logit, waits
/// until heads_done reads n_heads (the attention's merging blocks count), then reads a; the last
/// block clears heads_done and only it waits for the o-proj at its end (the grid still completes
/// only after the o-proj). The logits are the same sums in the same order (bit-identical).
/// logits_done (gate/up ranks, fused_launch.cuh): when set, every block adds 1 to it (release)
/// once its logit is written and there is no last block: no ranking, ids, counters nor clearing
/// of heads_done here (launch_moe_gate_up_normed's `ranks` does them); block 0 alone waits for
/// the o-proj.
void launch_router_folded(const float* folded, const float* h, const float* a, int n_experts, int hidden, int q_dim, int k,
                          const RouterOutputs& o, cudaStream_t stream, bool pdl = false, unsigned int* heads_done = nullptr,
                          int n_heads = 0, unsigned int* logits_done = nullptr);

/// launch_moe_gate_up_fused on xn = rmsnorm(x) ⊙ norm_w computed by every block (x: the residual
/// after the o-proj; its squares summed over the block's 256 threads), for the experts `ids`
/// (launch_router_folded's). Block 0 also writes weights[j] = softmax(logits / rms(x))[ids[j]]
/// from launch_router_folded's logits, divided by their sum over the k picks when `renormalise`.
/// With pdl it reads nothing but weights before its wait (the folded router launches it while the
/// o-proj may still run, fused_launch.cuh), unless given the handshakes below. hidden <= 2048 and
/// a multiple of 8, k <= 32,
/// n_experts in [k, 1024].
/// ids_ready (the early-ids handshake, fused_launch.cuh): when set, every block waits BEFORE its
/// PDL wait until the folded router's RouterOutputs::ids_ready flag reads 1, then reads ids and
/// issues its first unit's row loads, so they stream while the o-proj and the router finish; the
/// results are the same either way (bit-identical). The flag must be published by the router
/// launched just before and cleared by the down after (launch_moe_down_fused's ids_ready).
/// gate/up ranks (fused_launch.cuh): when logits_done is set, every block waits (before its PDL
/// wait) until it reads n_experts — the folded router's blocks count their logits — loads the
/// logits and ranks them itself (block_topk_by_rank_split, or block_topk_by_rank with
/// SERVEDECK_RANK_SPLIT=0: the experts and order of the router's last block); block 0 then
/// writes o.ids and fences them before it triggers the down (which reads them before its wait),
/// folds o's counters and clears heads_done (when set).
struct GateUpRanks {
  const unsigned int* logits_done = nullptr;  // nullptr: off
  RouterOutputs o{};                          // ids, hot_flags, counters, layer_counts
  unsigned int* heads_done = nullptr;         // the early routing's count, cleared by block 0
};

/// x_done, x_done_n (the early x, fused_launch.cuh; only with ids_ready): every block waits until
/// x_done reads x_done_n (the o-proj's blocks count, launch_gemv_bf16_pdl's rows_done) instead of
/// its PDL wait before reading x, lets the down launch then, and waits for its predecessor (the
/// router) only at its end, so that its completion still implies the router's and the o-proj's.
void launch_moe_gate_up_normed(const ExpertTable& table, const float* x, const __nv_bfloat16* norm_w, float eps,
                               const float* logits, int n_experts, bool renormalise, float* weights, const int32_t* ids, int k,
                               float* act, cudaStream_t stream, bool pdl = false, const unsigned int* ids_ready = nullptr,
                               const unsigned int* x_done = nullptr, int x_done_n = 0, const GateUpRanks& ranks = {});

/// act[j, r] = silu(gate_j[r]·xn) * (up_j[r]·xn), j < k, r < inter. act: (k, inter) fp32.
void launch_moe_gate_up_fused(const ExpertTable& table, const float* xn, const int32_t* ids, int k, float* act,
                              cudaStream_t stream, bool pdl = false);

/// out[h] += sum_{j=0..k-1} weights[j] * (down_j[h, :] · act[j, :]), in an order fixed by the
/// shapes alone (inter <= 768: per expert the lanes' column blocks in order, the warp's
/// reduce-scatter per 8 rows — its shuffle tree per row with SERVEDECK_REDUCE_SCATTER=0 — then the
/// experts in slot order).
/// act 16-byte aligned (std::invalid_argument otherwise).
/// With pdl, `ids` and `out` are read BEFORE waiting for the predecessor (for inter <= 768): they
/// must have been written before the predecessor started, as in the decode step (o-proj writes
/// out, the router ids, then gate/up, then down), or written and fenced by gate/up before it
/// triggered (gate/up ranks: its block 0 writes the ids), or — with the early x, where gate/up
/// lets the down launch before the router and the o-proj completed — published to gate/up before
/// it triggered (fused_launch.cuh). When k·16·inter·2 bytes fit in 200 KB of shared
/// memory (and SERVEDECK_DOWN_STAGED is not 0), each block also copies its 16 rows of every
/// routed expert into shared memory before the wait, so they stream while gate/up finishes; the
/// arithmetic is the same either way (bit-identical results).
/// ids_ready, x_done, logits_done: when set, block 0 clears them (stores 0) after its wait, ending
/// the early-ids, early-x and gate/up-ranks handshakes of the gate/up before it
/// (launch_moe_gate_up_normed).
void launch_moe_down_fused(const ExpertTable& table, const float* act, const int32_t* ids, const float* weights, int k,
                           float* out, cudaStream_t stream, bool pdl = false, unsigned int* ids_ready = nullptr,
                           unsigned int* x_done = nullptr, unsigned int* logits_done = nullptr);

/// y = W x (+ y when accumulate), as launch_gemv_bf16, launchable with PDL. W: (out, in) bf16,
/// in % 8 == 0, W and x 16-byte aligned. Rows staged in shared memory before the wait when
/// ceil(out / SMs) rows fit (o-proj 2048x4096: 16 rows = 128 KB per block), else one warp per row.
/// The staged rows are copied in 16 paced pieces (SERVEDECK_OPROJ_STAGE_PIECES), at most two in
/// flight per thread, so they do not queue ahead of the attention's loads running beside them.
/// With pdl and accumulate, the staged kernel reads y BEFORE waiting for the predecessor: y must
/// not be written by the immediate predecessor (in the decode step the o-proj accumulates into
/// the residual stream, last written by the previous layer's down, before q|k|v).
/// With accumulate and `res` set, y = res + W x instead (res read where y would be; y's old value
/// unused): the o-proj writing the residual stream's next buffer (launch_router_folded).
/// trigger_at_start (staged kernel only): lets its successor launch at its start (the early
/// routing's folded router, fused_launch.cuh) instead of after its wait. rows_done (the early x,
/// fused_launch.cuh): when set, every block adds 1 to it (release) once its rows of y are
/// written. Returns the number of blocks launched (what rows_done reaches).
int launch_gemv_bf16_pdl(const __nv_bfloat16* W, const float* x, float* y, int out, int in, bool accumulate,
                         cudaStream_t stream, bool pdl = false, const float* res = nullptr, bool trigger_at_start = false,
                         unsigned int* rows_done = nullptr);

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
/// predecessor (lm_head) before reading x. The decode step's greedy pick (CudaBackend::forward_greedy).
void launch_argmax_row(const float* x, int n, const ArgmaxScratch& s, int32_t* out, cudaStream_t stream, bool pdl = false);

}  // namespace servedeck::worker::cuda
