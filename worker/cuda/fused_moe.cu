// Fused decode kernels of the routed experts (see fused.cuh for the launch plan per layer):
// gate/up + SwiGLU for the experts the router chose (the down: fused_moe_down.cu).
#include <algorithm>
#include <cmath>
#include <type_traits>

#include "worker/cuda/block_norm.cuh"
#include "worker/cuda/dot.cuh"
#include "worker/cuda/fused.cuh"
#include "worker/cuda/fused_launch.cuh"
#include "worker/cuda/handshakes.cuh"
#include "worker/cuda/fused_moe_common.cuh"
#include "worker/cuda/launch_check.cuh"
#include "worker/cuda/quant_dot.cuh"
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

// gate/up's NORM mode (launch_moe_gate_up_normed): the norm weights, the folded router's
// outputs and the step's counters.
struct GateUpNorm {
  const bf16* norm_w = nullptr;
  float eps = 0.f;
  int n_experts = 0;
  int renormalise = 0;
  RouterOutputs o{};  // logits (unscaled: the router's logits times rms(x)); ids, weights and counters written by block 0
  StepSync sync{};    // H3: the router's count of logits written
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
  const float* logits = g.o.logits;
  float m = -INFINITY;
  for (int e = lane; e < g.n_experts; e += 32) m = fmaxf(m, __ldcg(logits + e) * inv);
  m = warp_max(m);
  const float mine = lane < k ? expf(__ldcg(logits + id) * inv - m) : 0.f;
  float den = 0.f;
  if (g.renormalise) {
    den = warp_sum(mine);
  } else {
    for (int e = lane; e < g.n_experts; e += 32) den += expf(__ldcg(logits + e) * inv - m);
    den = warp_sum(den);
  }
  if (lane < k) g.o.weights[lane] = mine / den;
}

/// Where a quantised gate/up keeps the normed x: in chunked_x_index order (quant_dot.cuh).
template <ExpertFormat F>
struct ChunkedColumns {
  int cols;
  __device__ int operator()(int c) const { return detail::chunked_x_index<F>(c, cols); }
};

// The same for hidden <= 8 * 32 * C, one (j, r) unit per warp at a time with all of its loads in
// flight (C 16-byte column blocks of the gate row and C of the up row per lane, for hidden 2048
// C = 8: 64 registers of weights), xn staged in shared memory. The grid is two blocks per SM,
// so every block is resident at once even beside the router's blocks (the previous kernel,
// still running when these are scheduled: docs/performance.md, 2026-11-29 "gate/up grid"). Per
// lane the terms are summed in lane_dot's order, so act is bit-identical to
// moe_gate_up_fused_kernel's. Every warp's first unit's loads are issued before the norm (NORM:
// before the PDL wait), so their round trip overlaps it.
//
// NORM (launch_moe_gate_up_normed): xn is the residual x, and every block computes
// xs = x / rms(x) ⊙ g.norm_w itself (block_rmsnorm_prefetched, the norm weights loaded before the
// wait). Before its PDL wait every block also waits for the router's logits (handshakes.cuh H3),
// ranks them (block_topk_by_rank_split: the experts and order of ranking the router's
// probabilities) and stages the expert table in shared memory (written at load and by the
// hot-expert cache's fills, never during a step: the routed experts' pointers are then one
// shared load away); block 0 writes the ids for the down (H4), the routing counters and, after
// the norm, the routing weights (routing_weights).
template <int C, bool NORM = false, ExpertFormat F = ExpertFormat::bf16>
__global__ void __launch_bounds__(k_moe_warps * 32, 2) moe_gate_up_wide_kernel(ExpertTable t, const float* __restrict__ xn,
                                                                               const int32_t* __restrict__ ids, int k,
                                                                               float* __restrict__ act, GateUpNorm g) {
  SERVEDECK_TRACE_BLOCK();
  // Quantised experts (NORM only): a unit is the gate and up rows as stored (C uint4 of each
  // per lane: 16 fp8 or 32 e2m1 weights per uint4) with each uint4's scale, dequantised in
  // registers by quant_dot.cuh's dots against x in chunked_x_index order.
  constexpr bool Q = F != ExpertFormat::bf16;
  static_assert(!Q || NORM, "quantised experts run gate/up only after the folded router");
  using Scale = std::conditional_t<F == ExpertFormat::fp8_block, float, uint16_t>;
  extern __shared__ float4 xs4[];
  __shared__ const bf16* blocks[32];
  __shared__ float red[k_moe_warps];
  const int lane = threadIdx.x % 32;
  const int total = k * t.inter, n8 = Q ? t.hidden / detail::chunk_cols<F>() : t.hidden / 8;  // n8: uint4 per row
  const int gw0 = blockIdx.x * k_moe_warps + threadIdx.x / 32, stride = gridDim.x * k_moe_warps;
  detail::NormWeights<k_norm_vecs> nwp;
  if constexpr (NORM) {
    nwp = detail::prefetch_norm_weights<k_moe_warps * 32, k_norm_vecs>(g.norm_w, t.hidden);
    for (int e = threadIdx.x; e < g.n_experts; e += k_moe_warps * 32) expert_table_smem(xs4, t.hidden)[e] = t.experts[e];
  }
  uint4 wg[C], wu[C];
  Scale sg[C], su[C];
  float glob_g = 0.f, glob_u = 0.f;  // nvfp4: the matrices' weight_scale_2 × 2^14
  const QuantLayout QL = layout_of(t);
  const auto load_unit = [&](int gw) {
    const int j = gw / t.inter, r = gw % t.inter;
    if constexpr (Q) {
      const uint8_t* blk = reinterpret_cast<const uint8_t*>(blocks[j]);
      const detail::RowRef gr = detail::row_of<F>(blk, QL, 0, r), ur = detail::row_of<F>(blk, QL, 1, r);
      const auto scale = [&](const detail::RowRef& ref, int i) -> Scale {
        if constexpr (F == ExpertFormat::fp8_block) return reinterpret_cast<const float*>(ref.s)[(16 * i) / QL.bc];
        else return reinterpret_cast<const uint16_t*>(ref.s)[i];
      };
#pragma unroll
      for (int c = 0; c < C; ++c) {
        const int i = lane + 32 * c;
        wg[c] = i < n8 ? reinterpret_cast<const uint4*>(gr.w)[i] : make_uint4(0, 0, 0, 0);
        wu[c] = i < n8 ? reinterpret_cast<const uint4*>(ur.w)[i] : make_uint4(0, 0, 0, 0);
        sg[c] = i < n8 ? scale(gr, i) : Scale{};
        su[c] = i < n8 ? scale(ur, i) : Scale{};
      }
      glob_g = gr.g;
      glob_u = ur.g;
    } else {
      const uint4* gp = reinterpret_cast<const uint4*>(blocks[j] + static_cast<size_t>(r) * t.hidden);
      const uint4* up = reinterpret_cast<const uint4*>(blocks[j] + static_cast<size_t>(t.inter + r) * t.hidden);
#pragma unroll
      for (int c = 0; c < C; ++c) {
        const int i = lane + 32 * c;
        wg[c] = i < n8 ? gp[i] : make_uint4(0, 0, 0, 0);
        wu[c] = i < n8 ? up[i] : make_uint4(0, 0, 0, 0);
      }
    }
  };
  // The routed experts (NORM: ranked by this block, pick_id; else this layer's router's ids,
  // complete once the wait returned) and their pointers in shared memory.
  __shared__ int pick_id[32];
  __shared__ float pick_v[32];
  if constexpr (NORM) {
    // H3: every router block's logit, ranked here (in x's shared memory, written only after the
    // wait).
    if (threadIdx.x == 0) detail::wait_for_count(g.sync.logits_done, detail::step_target(g.sync.epoch, static_cast<unsigned>(g.n_experts)));
    __syncthreads();
    float* p = reinterpret_cast<float*>(xs4);
    for (int e = threadIdx.x; e < g.n_experts; e += k_moe_warps * 32) p[e] = __ldcg(g.o.logits + e);
    __syncthreads();
    __shared__ int rank_cnt[k_moe_warps * 32];
    detail::block_topk_by_rank_split(p, g.n_experts, k, threadIdx.x, k_moe_warps * 32, pick_id, pick_v, rank_cnt, -INFINITY);
    __syncthreads();
    if (blockIdx.x == 0) {
      const int j = static_cast<int>(threadIdx.x), e = j < k ? pick_id[j] : 0;
      if (j < k) g.o.ids[j] = e;
      __syncthreads();
      if (j == 0) __threadfence();  // H4: the ids at device scope before this block triggers the down
      if (j < k) detail::count_pick(g.o.hot_flags, g.o.counters, g.o.layer_counts, e);
    }
    SERVEDECK_TRACE_STAGED();  // the trace's "staged": the ids ranked
    __syncthreads();  // the table is visible to the block
    if (threadIdx.x < k) blocks[threadIdx.x] = expert_table_smem(xs4, t.hidden)[pick_id[threadIdx.x]];
    __syncthreads();
    if (gw0 < total) load_unit(gw0);
    wait_for_predecessor();
    float* xs = reinterpret_cast<float*>(xs4);
    float inv;
    if constexpr (Q)
      inv = detail::block_rmsnorm_prefetched<k_moe_warps * 32, k_norm_vecs>(xn, nwp, g.eps, t.hidden, xs, red, ChunkedColumns<F>{t.hidden});
    else
      inv = detail::block_rmsnorm_prefetched<k_moe_warps * 32, k_norm_vecs>(xn, nwp, g.eps, t.hidden, xs, red);
    if (blockIdx.x == 0 && threadIdx.x < 32) routing_weights(g, inv, lane < k ? pick_id[lane] : 0, k, lane);
  } else {
    wait_for_predecessor();
    if (threadIdx.x < k) blocks[threadIdx.x] = t.experts[__ldcg(ids + threadIdx.x)];
    __syncthreads();
    if (gw0 < total) load_unit(gw0);
    for (int i = threadIdx.x; i < t.hidden / 4; i += k_moe_warps * 32) xs4[i] = reinterpret_cast<const float4*>(xn)[i];
    __syncthreads();
  }
  for (int gw = gw0; gw < total; gw += stride) {
    if (gw != gw0) load_unit(gw);
    float gs = 0.f, us = 0.f;
    if constexpr (Q) {
      // The chunks in increasing order, as quant_moe.cu's lane_rows_dot sums them.
      const float* xs = reinterpret_cast<const float*>(xs4);
      const int gsx = 4 * n8;
#pragma unroll
      for (int c = 0; c < C; ++c) {
        const int i = lane + 32 * c;
        if (i < n8) {
          if constexpr (F == ExpertFormat::fp8_block) {
            gs += detail::dot16_fp8(wg[c], sg[c], xs + 4 * i, gsx);
            us += detail::dot16_fp8(wu[c], su[c], xs + 4 * i, gsx);
          } else {
            gs += detail::dot32_fp4_stored(wg[c], sg[c], glob_g, xs + 4 * i, gsx);
            us += detail::dot32_fp4_stored(wu[c], su[c], glob_u, xs + 4 * i, gsx);
          }
        }
      }
    } else {
#pragma unroll
      for (int c = 0; c < C; ++c) {
        const int i = lane + 32 * c;
        if (i < n8) {
          const float4 a = xs4[2 * i], b = xs4[2 * i + 1];
          gs += detail::dot8(wg[c], a, b);
          us += detail::dot8(wu[c], a, b);
        }
      }
    }
    gs = warp_sum(gs);
    us = warp_sum(us);
    if (lane == 0) act[gw] = gs / (1.f + expf(-gs)) * us;
  }
}

// The wide gate/up kernels' grid: two blocks per SM (one would leave the staged down's block
// room beside it, but measured slower: docs/performance.md, 2026-11-30 "gate/up grid").
int gate_up_grid(const ExpertTable& table, int k) {
  const int units = k * table.inter;
  return std::min((units + k_moe_warps - 1) / k_moe_warps, 2 * detail::sm_count());
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

void launch_moe_gate_up_normed(const ExpertTable& table, const float* x, const bf16* norm_w, float eps, int n_experts, int k,
                               bool renormalise, const RouterOutputs& o, const StepSync& sync, float* act, cudaStream_t stream, bool pdl) {
  detail::require(table.hidden % 8 == 0 && table.hidden <= 4 * k_moe_warps * 32 * k_norm_vecs && table.inter % 8 == 0 && k > 0 &&
                      k <= 32 && n_experts >= k && n_experts <= table.hidden,
                  "launch_moe_gate_up_normed",
                  "hidden must be a multiple of 8 and <= 2048, inter a multiple of 8, k in (0, 32] and n_experts in [k, hidden], got " +
                      std::to_string(table.hidden) + ", " + std::to_string(table.inter) + ", " + std::to_string(k) + ", " +
                      std::to_string(n_experts));
  detail::require(detail::aligned16(x) && detail::aligned8(norm_w), "launch_moe_gate_up_normed",
                  "x must be 16-byte aligned and norm_w 8-byte aligned");
  detail::require(o.logits != nullptr && o.ids != nullptr && o.weights != nullptr && o.hot_flags != nullptr && o.counters != nullptr &&
                      o.layer_counts != nullptr && sync.epoch != nullptr && sync.logits_done != nullptr,
                  "launch_moe_gate_up_normed", "the router outputs' logits, ids, weights, hot_flags and counters and the step's epoch "
                  "and logits counter must be set");
  const int n8 = table.hidden / 8, grid = gate_up_grid(table, k);
  const std::size_t smem = static_cast<std::size_t>(table.hidden) * sizeof(float) + static_cast<std::size_t>(n_experts) * sizeof(const bf16*);
  const GateUpNorm g{norm_w, eps, n_experts, renormalise ? 1 : 0, o, sync};
  auto go = [&](auto kernel) {
    detail::prefer_max_shared(kernel);
    launch(kernel, grid, k_moe_warps * 32, smem, stream, pdl, table, x, o.ids, k, act, g);
  };
  switch (table.format) {
    case ExpertFormat::fp8_block:  // 16 weights per uint4: hidden <= 2048 is <= 4 per lane
      detail::require(table.hidden % 32 == 0 && table.block_cols > 0 && table.block_cols % 16 == 0 && table.block_rows > 0,
                      "launch_moe_gate_up_normed",
                      "fp8 experts need hidden a multiple of 32, block columns a positive multiple of 16 and block rows > 0, got hidden " +
                          std::to_string(table.hidden) + ", block " + std::to_string(table.block_rows) + "x" + std::to_string(table.block_cols));
      return go(moe_gate_up_wide_kernel<4, true, ExpertFormat::fp8_block>);
    case ExpertFormat::nvfp4:  // 32 weights per uint4: <= 2 per lane
      detail::require(table.hidden % 32 == 0, "launch_moe_gate_up_normed", "nvfp4 experts need hidden a multiple of 32");
      return go(moe_gate_up_wide_kernel<2, true, ExpertFormat::nvfp4>);
    case ExpertFormat::bf16:
      break;
  }
  if (n8 <= 32 * 4) return go(moe_gate_up_wide_kernel<4, true>);
  go(moe_gate_up_wide_kernel<8, true>);  // n8 <= 256 by the precondition
}

}  // namespace servedeck::worker::cuda

SERVEDECK_TRACE_TU_SETTER(set_decode_trace_buffer_fused_moe)
