// Fused decode kernels of the routed experts (see fused.cuh for the launch plan per layer):
// gate/up + SwiGLU for the experts the router chose (the down: fused_moe_down.cu).
#include <algorithm>
#include <cmath>

#include "worker/cuda/block_norm.cuh"
#include "worker/cuda/dot.cuh"
#include "worker/cuda/fused.cuh"
#include "worker/cuda/fused_launch.cuh"
#include "worker/cuda/fused_moe_common.cuh"
#include "worker/cuda/launch_check.cuh"
#include "worker/cuda/router_select.cuh"

namespace servedeck::worker::cuda {

namespace {

using bf16 = __nv_bfloat16;
using detail::grid_for;
using detail::lane_dot;
using detail::launch;
using detail::wait_for_predecessor;
using detail::warp_max;
using detail::warp_sum;


// gate row r and up row r of expert j, SwiGLU: one warp per (j, r).
__global__ void __launch_bounds__(k_moe_warps * 32) moe_gate_up_fused_kernel(ExpertTable t, const float* __restrict__ xn,
                                                                            const int32_t* __restrict__ ids, int k,
                                                                            float* __restrict__ act) {
  SERVEDECK_TRACE_BLOCK();
  __shared__ const bf16* blocks[32];
  const int lane = threadIdx.x % 32;
  const int total = k * t.inter;
  wait_for_predecessor();
  if (threadIdx.x < k) blocks[threadIdx.x] = t.experts[ids[threadIdx.x]];
  __syncthreads();
  for (int gw = blockIdx.x * k_moe_warps + threadIdx.x / 32; gw < total; gw += gridDim.x * k_moe_warps) {
    const int j = gw / t.inter, r = gw % t.inter;
    const bf16* block = blocks[j];
    const float g = lane_dot(block + static_cast<size_t>(r) * t.hidden, xn, t.hidden, lane);
    const float u = lane_dot(block + static_cast<size_t>(t.inter + r) * t.hidden, xn, t.hidden, lane);
    const float gs = warp_sum(g), us = warp_sum(u);
    if (lane == 0) act[gw] = gs / (1.f + expf(-gs)) * us;
  }
}

// gate/up's NORM mode (launch_moe_gate_up_normed): the norm weights and the folded router's
// outputs.
struct GateUpNorm {
  const bf16* norm_w = nullptr;
  float eps = 0.f;
  const float* logits = nullptr;  // (n_experts) unscaled: the router's logits times rms(x)
  int n_experts = 0;
  int renormalise = 0;
  float* weights = nullptr;       // (k)
  int table_in_smem = 0;          // the expert table copied to shared memory before the wait
  const unsigned int* ids_ready = nullptr;  // the early-ids handshake (fused_launch.cuh), or nullptr
  const unsigned int* x_done = nullptr;     // the early x (fused_launch.cuh; with ids_ready), or nullptr
  unsigned int x_done_n = 0;                // the o-proj's blocks
  GateUpRanks rk{};                          // gate/up ranks (fused_launch.cuh) when rk.logits_done is set
  int rank_split = 1;                        // rank over all threads (block_topk_by_rank_split)
};

// Where gate/up's NORM mode keeps the expert table: after the hidden floats of x in its dynamic
// shared memory (16-byte aligned, n_experts pointers).
__device__ __forceinline__ const bf16** expert_table_smem(float4* xs4, int hidden) {
  return reinterpret_cast<const bf16**>(xs4 + hidden / 4);
}
constexpr int k_norm_vecs = 2;  // float4 of x per thread: hidden <= 4 · 256 · 2 = 2048 (the wide kernel's C = 8)

// One warp: the routing weights from the folded router's unscaled logits and 1 / rms(x):
// p = softmax(logits · inv) (max subtracted; the sums by the shuffle tree), weights[j] = p[ids[j]]
// (divided by the sum over the k picks when renormalising). k <= 32; id: lane j's pick ids[j].
__device__ __forceinline__ void routing_weights(const GateUpNorm& g, float inv, int id, int k, int lane) {
  float m = -INFINITY;
  for (int e = lane; e < g.n_experts; e += 32) m = fmaxf(m, __ldcg(g.logits + e) * inv);
  m = warp_max(m);
  const float mine = lane < k ? expf(__ldcg(g.logits + id) * inv - m) : 0.f;
  float den = 0.f;
  if (g.renormalise) {
    den = warp_sum(mine);
  } else {
    for (int e = lane; e < g.n_experts; e += 32) den += expf(__ldcg(g.logits + e) * inv - m);
    den = warp_sum(den);
  }
  if (lane < k) g.weights[lane] = mine / den;
}

// The same for hidden <= 8 * 32 * C, one (j, r) unit per warp at a time with all of its loads in
// flight (C 16-byte column blocks of the gate row and C of the up row per lane, for hidden 2048
// C = 8: 64 registers of weights), xn staged in shared memory. The grid is two blocks per SM,
// so every block is resident at once even beside the router's blocks (the previous kernel,
// still running when these are scheduled): measured on the H200 (session 6 trace, run 1), the
// one-unit-per-warp grid of 768 blocks did not fit beside the router and its last blocks passed
// the wait ~12 µs after the first. Per lane the terms are summed in lane_dot's order, so act is
// bit-identical to moe_gate_up_fused_kernel's.
//
// NORM (launch_moe_gate_up_normed): xn is the residual x, and every block computes
// xs = x / rms(x) ⊙ g.norm_w itself (block_rmsnorm_prefetched, the norm weights loaded before the
// wait); block 0's warp 0 also writes the routing weights (routing_weights).
template <int C, bool NORM = false>
__global__ void __launch_bounds__(k_moe_warps * 32, 2) moe_gate_up_wide_kernel(ExpertTable t, const float* __restrict__ xn,
                                                                               const int32_t* __restrict__ ids, int k,
                                                                               float* __restrict__ act, GateUpNorm g) {
  SERVEDECK_TRACE_BLOCK();
  extern __shared__ float4 xs4[];
  __shared__ const bf16* blocks[32];
  __shared__ float red[k_moe_warps];
  const int lane = threadIdx.x % 32;
  const int total = k * t.inter, n8 = t.hidden / 8;
  const int gw0 = blockIdx.x * k_moe_warps + threadIdx.x / 32, stride = gridDim.x * k_moe_warps;
  detail::NormWeights<k_norm_vecs> nwp;
  if constexpr (NORM) {
    nwp = detail::prefetch_norm_weights<k_moe_warps * 32, k_norm_vecs>(g.norm_w, t.hidden);
    // The expert table too (written at load and by the hot-expert cache's fills, never during a
    // step), so that after the wait the routed experts' pointers are one load (ids) away, not
    // two. Measured on the H200 (session 10 run 1, GPU step at position ~190): 2.438 ms with it
    // against 2.479 without. Stored after the poll instead (so that thread 0's poll does not
    // first wait for the table's round trip) measured no faster (session 15 runs 2-3).
    if (g.table_in_smem)
      for (int e = threadIdx.x; e < g.n_experts; e += k_moe_warps * 32) expert_table_smem(xs4, t.hidden)[e] = t.experts[e];
  }
  // Every warp's first unit's loads before the norm, so their round trip overlaps the norm's
  // (measured on the H200, session 9 runs 4-5: GPU step 2.439 against 2.467 ms without); with
  // the early-ids handshake (NORM, g.ids_ready) even before the wait, as soon as the router has
  // published the ids.
  uint4 wg[C], wu[C];
  const auto load_unit = [&](int gw) {
    const int j = gw / t.inter, r = gw % t.inter;
    const uint4* gp = reinterpret_cast<const uint4*>(blocks[j] + static_cast<size_t>(r) * t.hidden);
    const uint4* up = reinterpret_cast<const uint4*>(blocks[j] + static_cast<size_t>(t.inter + r) * t.hidden);
#pragma unroll
    for (int c = 0; c < C; ++c) {
      const int i = lane + 32 * c;
      wg[c] = i < n8 ? gp[i] : make_uint4(0, 0, 0, 0);
      wu[c] = i < n8 ? up[i] : make_uint4(0, 0, 0, 0);
    }
  };
  // The routed experts' pointers to shared memory (ids: this layer's router's, published or
  // complete once the wait returned, or ranked by this block: pick_id).
  __shared__ int pick_id[32];
  __shared__ float pick_v[32];
  const bool ranks = NORM && g.rk.logits_done != nullptr;
  const auto pick = [&](int j) { return ranks ? pick_id[j] : __ldcg(ids + j); };
  const auto select_experts = [&] {
    if (NORM && g.table_in_smem) {
      __syncthreads();  // the table is visible to the block
      if (threadIdx.x < k) blocks[threadIdx.x] = expert_table_smem(xs4, t.hidden)[pick(threadIdx.x)];
    } else if (threadIdx.x < k) {
      blocks[threadIdx.x] = t.experts[pick(threadIdx.x)];
    }
    __syncthreads();
  };
  const bool early = NORM && (g.ids_ready != nullptr || ranks);
  if (early) {
    if (ranks) {
      // Every router block's logit, ranked here (in x's shared memory, written only after the
      // wait); block 0 writes the ids for the down and the counters.
      if (threadIdx.x == 0) detail::wait_for_count(g.rk.logits_done, static_cast<unsigned int>(g.n_experts));
      __syncthreads();
      float* p = reinterpret_cast<float*>(xs4);
      for (int e = threadIdx.x; e < g.n_experts; e += k_moe_warps * 32) p[e] = __ldcg(g.logits + e);
      __syncthreads();
      __shared__ int rank_cnt[k_moe_warps * 32];
      if (g.rank_split)
        detail::block_topk_by_rank_split(p, g.n_experts, k, threadIdx.x, k_moe_warps * 32, pick_id, pick_v, rank_cnt, -INFINITY);
      else
        detail::block_topk_by_rank(p, g.n_experts, k, threadIdx.x, k_moe_warps * 32, pick_id, pick_v, -INFINITY);
      __syncthreads();
      if (blockIdx.x == 0) {
        const int j = static_cast<int>(threadIdx.x), e = j < k ? pick_id[j] : 0;
        if (j < k) g.rk.o.ids[j] = e;
        __syncthreads();
        if (j == 0) {
          // The ids reach L2 before this block triggers the down (which launches only once every
          // gate/up block triggered, after its wait) and reads them before its own wait. No flag:
          // a flag the down's block 0 cleared after its wait hung down blocks placed later
          // (session 13 run 6).
          __threadfence();
          if (g.rk.heads_done != nullptr) *g.rk.heads_done = 0u;  // every router block has read it
        }
        if (j < k) {
          detail::count_pick(g.rk.o.hot_flags, g.rk.o.counters, g.rk.o.layer_counts, e);
        }
      }
    } else {
      if (threadIdx.x == 0) detail::wait_for_count(g.ids_ready, 1u);
      __syncthreads();  // every thread's reads of ids after the flag's acquire
    }
    SERVEDECK_TRACE_STAGED();  // the trace's "staged": the ids seen
    select_experts();
    if (gw0 < total) load_unit(gw0);
  }
  // With the early x, the o-proj's rows of x counted instead of the PDL wait, which comes last.
  const bool early_x = early && g.x_done != nullptr;
  if (early_x) {
#ifdef SERVEDECK_DECODE_TRACE
    const unsigned long long t_wait = detail::trace_now();
#endif
    if (threadIdx.x == 0) detail::wait_for_count(g.x_done, g.x_done_n);
    __syncthreads();  // every thread's reads of x after the count's acquire
    asm volatile("griddepcontrol.launch_dependents;" :::);
#ifdef SERVEDECK_DECODE_TRACE
    detail::trace_wait_marks(t_wait);
#endif
  } else {
    wait_for_predecessor();
  }
  if (!early) {
    select_experts();
    if (gw0 < total) load_unit(gw0);
  }
  if constexpr (NORM) {
    float* xs = reinterpret_cast<float*>(xs4);
    const float inv = detail::block_rmsnorm_prefetched<k_moe_warps * 32, k_norm_vecs>(xn, nwp, g.eps, t.hidden, xs, red);
    if (blockIdx.x == 0 && threadIdx.x < 32) routing_weights(g, inv, lane < k ? pick(lane) : 0, k, lane);
  } else {
    for (int i = threadIdx.x; i < t.hidden / 4; i += k_moe_warps * 32) xs4[i] = reinterpret_cast<const float4*>(xn)[i];
    __syncthreads();
  }
  for (int gw = gw0; gw < total; gw += stride) {
    if (gw != gw0) load_unit(gw);
    float gs = 0.f, us = 0.f;
#pragma unroll
    for (int c = 0; c < C; ++c) {
      const int i = lane + 32 * c;
      if (i < n8) {
        const float4 a = xs4[2 * i], b = xs4[2 * i + 1];
        gs += detail::dot8(wg[c], a, b);
        us += detail::dot8(wu[c], a, b);
      }
    }
    gs = warp_sum(gs);
    us = warp_sum(us);
    if (lane == 0) act[gw] = gs / (1.f + expf(-gs)) * us;
  }
  if (early_x) asm volatile("griddepcontrol.wait;" ::: "memory");  // completes only after the router
}

// The wide gate/up kernels' grid: two blocks per SM; SERVEDECK_GATE_UP_BLOCKS_PER_SM overrides
// (A/B switch: one block per SM would leave the staged down's block room beside it, but measured
// slower, session 7 run 1). Clamped to [1, 32] (an SM holds at most 32 blocks), so per_sm · SMs
// cannot overflow.
int gate_up_grid(const ExpertTable& table, int k) {
  const int units = k * table.inter;
  const int per_sm = std::clamp(detail::env_knob("SERVEDECK_GATE_UP_BLOCKS_PER_SM", 2), 1, 32);
  return std::min((units + k_moe_warps - 1) / k_moe_warps, per_sm * detail::sm_count());
}

}  // namespace

void launch_moe_gate_up_fused(const ExpertTable& table, const float* xn, const int32_t* ids, int k, float* act,
                              cudaStream_t stream, bool pdl) {
  detail::require(table.hidden % 8 == 0 && table.inter % 8 == 0 && k > 0 && k <= 32, "launch_moe_gate_up_fused",
                  "hidden and inter must be multiples of 8 and k in (0, 32], got " + std::to_string(table.hidden) + ", " +
                      std::to_string(table.inter) + ", " + std::to_string(k));
  detail::require(detail::aligned16(xn), "launch_moe_gate_up_fused", "xn must be 16-byte aligned");
  const int n8 = table.hidden / 8, grid = gate_up_grid(table, k);
  const std::size_t smem = static_cast<std::size_t>(table.hidden) * sizeof(float);
  if (n8 <= 32 * 4) return detail::prefer_max_shared(moe_gate_up_wide_kernel<4>), launch(moe_gate_up_wide_kernel<4>, grid, k_moe_warps * 32, smem, stream, pdl, table, xn, ids, k, act, GateUpNorm{});
  if (n8 <= 32 * 8) return detail::prefer_max_shared(moe_gate_up_wide_kernel<8>), launch(moe_gate_up_wide_kernel<8>, grid, k_moe_warps * 32, smem, stream, pdl, table, xn, ids, k, act, GateUpNorm{});
  launch(moe_gate_up_fused_kernel, grid_for(k * table.inter, k_moe_warps), k_moe_warps * 32, 0, stream, pdl, table, xn, ids, k, act);
}

void launch_moe_gate_up_normed(const ExpertTable& table, const float* x, const bf16* norm_w, float eps, const float* logits,
                               int n_experts, bool renormalise, float* weights, const int32_t* ids, int k, float* act,
                               cudaStream_t stream, bool pdl, const unsigned int* ids_ready, const unsigned int* x_done,
                               int x_done_n, const GateUpRanks& ranks) {
  detail::require(table.hidden % 8 == 0 && table.hidden <= 4 * k_moe_warps * 32 * k_norm_vecs && table.inter % 8 == 0 && k > 0 &&
                      k <= 32 && n_experts >= k && n_experts <= 1024,
                  "launch_moe_gate_up_normed",
                  "hidden must be a multiple of 8 and <= 2048, inter a multiple of 8, k in (0, 32] and n_experts in [k, 1024], got " +
                      std::to_string(table.hidden) + ", " + std::to_string(table.inter) + ", " + std::to_string(k) + ", " +
                      std::to_string(n_experts));
  detail::require(detail::aligned16(x) && detail::aligned8(norm_w), "launch_moe_gate_up_normed",
                  "x must be 16-byte aligned and norm_w 8-byte aligned");
  const int n8 = table.hidden / 8, grid = gate_up_grid(table, k);
  // The expert table in shared memory before the wait unless SERVEDECK_GATE_UP_TABLE=0 (A/B).
  const int tbl = detail::env_knob("SERVEDECK_GATE_UP_TABLE", 1) != 0 ? 1 : 0;
  // The ranking split over all 256 threads (block_topk_by_rank_split) unless
  // SERVEDECK_RANK_SPLIT=0 (A/B). Measured on the H200 (session 15 run 2, GPU step at position
  // ~190, each twice): 2.236 ms against 2.265-2.266 with 128 threads.
  const int split = detail::env_knob("SERVEDECK_RANK_SPLIT", 1) != 0 ? 1 : 0;
  const std::size_t smem = static_cast<std::size_t>(table.hidden) * sizeof(float) +
                           (tbl ? static_cast<std::size_t>(n_experts) * sizeof(const bf16*) : 0);
  detail::require(x_done == nullptr || ((ids_ready != nullptr || ranks.logits_done != nullptr) && x_done_n > 0),
                  "launch_moe_gate_up_normed",
                  "x_done needs ids_ready (or the ranking) and a positive count, got count " + std::to_string(x_done_n));
  detail::require(ranks.logits_done == nullptr ||
                      (n_experts <= table.hidden && ranks.o.ids != nullptr &&
                       ranks.o.hot_flags != nullptr && ranks.o.counters != nullptr && ranks.o.layer_counts != nullptr),
                  "launch_moe_gate_up_normed",
                  "ranking needs n_experts <= hidden (got " + std::to_string(n_experts) + " and " + std::to_string(table.hidden) +
                      ") and the router outputs' ids, hot_flags and counters");
  const GateUpNorm g{norm_w, eps, logits, n_experts, renormalise ? 1 : 0, weights, tbl, ids_ready, x_done,
                     static_cast<unsigned int>(x_done_n), ranks, split};
  auto go = [&](auto kernel) {
    detail::prefer_max_shared(kernel);
    launch(kernel, grid, k_moe_warps * 32, smem, stream, pdl, table, x, ids, k, act, g);
  };
  if (n8 <= 32 * 4) return go(moe_gate_up_wide_kernel<4, true>);
  go(moe_gate_up_wide_kernel<8, true>);  // n8 <= 256 by the precondition
}

}  // namespace servedeck::worker::cuda

SERVEDECK_TRACE_TU_SETTER(set_decode_trace_buffer_fused_moe)
