// Fused decode kernels of the routed experts (see fused.cuh for the launch plan per layer): down
// + weighted reduction + residual, for the experts the router chose (gate/up: fused_moe.cu).
#include <string>

#include "worker/cuda/dot.cuh"
#include "worker/cuda/fused.cuh"
#include "worker/cuda/fused_launch.cuh"
#include "worker/cuda/fused_moe_common.cuh"
#include "worker/cuda/launch_check.cuh"

namespace servedeck::worker::cuda {

namespace {

using bf16 = __nv_bfloat16;
using detail::grid_for;
using detail::launch;
using detail::wait_for_predecessor;
using detail::warp_sum;

// down row h of every routed expert, weighted sum in the order j = 0..k-1, residual add. The
// routed experts' down pointers and weights go to shared memory once per block; a lane then
// walks its columns with the loads of up to eight experts in flight at once (per-expert sums in
// column order, then tot += w_j * sum_j in expert order: a fixed order).
__global__ void __launch_bounds__(k_moe_warps * 32) moe_down_fused_kernel(ExpertTable t, const float* __restrict__ act,
                                                                         const int32_t* __restrict__ ids,
                                                                         const float* __restrict__ weights, int k,
                                                                         float* __restrict__ out) {
  SERVEDECK_TRACE_BLOCK();
  __shared__ const bf16* down[32];
  __shared__ float wj[32];
  const int lane = threadIdx.x % 32;
  wait_for_predecessor();
  if (threadIdx.x < k) {
    down[threadIdx.x] = t.experts[ids[threadIdx.x]] + static_cast<size_t>(2) * t.inter * t.hidden;
    wj[threadIdx.x] = weights[threadIdx.x];
  }
  __syncthreads();
  const int n8 = t.inter / 8;
  for (int h = blockIdx.x * k_moe_warps + threadIdx.x / 32; h < t.hidden; h += gridDim.x * k_moe_warps) {
    float tot = 0.f;
    for (int j0 = 0; j0 < k; j0 += 8) {
      float part[8];
#pragma unroll
      for (int u = 0; u < 8; ++u) part[u] = 0.f;
      for (int i = lane; i < n8; i += 32) {
#pragma unroll
        for (int u = 0; u < 8; ++u) {
          if (j0 + u < k) {
            const uint4 w = reinterpret_cast<const uint4*>(down[j0 + u] + static_cast<size_t>(h) * t.inter)[i];
            const float4* a4 = reinterpret_cast<const float4*>(act + static_cast<size_t>(j0 + u) * t.inter);
            part[u] += detail::dot8(w, a4[2 * i], a4[2 * i + 1]);
          }
        }
      }
#pragma unroll
      for (int u = 0; u < 8; ++u)
        if (j0 + u < k) tot += wj[j0 + u] * part[u];
    }
    tot = warp_sum(tot);
    if (lane == 0) out[h] += tot;
  }
}

// down for inter <= 768 (CH <= 3 16-byte column blocks per lane): block b owns the hidden rows
// [16 b, 16 b + 16); warp w takes routed slots j = w, w + 8, ... and reads down_j's rows of the
// block, 8 rows' loads in flight at once (a lane holds its CH column blocks of each row). The
// ids were written two launches back by the unfolded router, or by gate/up's block 0 before it
// triggered (handshakes.cuh H4), so ids, the expert pointer and the first 8 rows are read BEFORE
// waiting for gate/up; act only after. Per (j, row) the lane sums its blocks in order and the
// warp reduces (down_row_group); then out[h] += sum_j weights[j] * part[j][h] in slot order: a
// fixed order. 128 registers (launch bounds): one block of the next layer's q|k|v GEMV fits
// beside it and stages its weights meanwhile.
constexpr int k_down_rows = 16;

// A load the compiler may not hoist out of the row-group loop (it would hold CH·8 more
// registers across it); the re-read hits L1.
__device__ __forceinline__ float4 load_act(const float4* p) {
  float4 v;
  asm volatile("ld.global.v4.f32 {%0, %1, %2, %3}, [%4];" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "l"(p));
  return v;
}

// One group of RG rows of routed slot j in the down kernels: s[r] = this lane's CH column blocks
// of row g + r dotted with act_j, in column order (weight(r, c): the 16-byte block of row g + r
// at column block lane + 32 c, zero past the rows or columns; act(c, a, b): act_j's two float4
// of that column block, zero past the columns), then the warp's sums of the 8 rows into
// part[j][g + r] (detail::store_row_sums8: one reduce-scatter). Shared by the row
// kernel (weights in registers) and the staged one (weights in shared memory, act possibly
// loaded before its rows landed), so that their results stay bit-identical.
template <int CH, int RG, class Act, class Weight>
__device__ __forceinline__ void down_row_group(Act act, int g, int nrows, int lane, int j, Weight weight, float (*part)[k_down_rows]) {
  static_assert(RG == 8, "the row sums are stored eight at a time");
  float s[RG];
#pragma unroll
  for (int r = 0; r < RG; ++r) s[r] = 0.f;
#pragma unroll
  for (int c = 0; c < CH; ++c) {
    float4 a, b;
    act(c, a, b);
#pragma unroll
    for (int r = 0; r < RG; ++r) s[r] += detail::dot8(weight(r, c), a, b);
  }
  detail::store_row_sums8(s, lane, g, nrows, part[j]);
}

// act_j's column block lane + 32 c (two float4) from global memory, zero past n8 (load_act: not
// hoisted, so the row kernel does not hold them across its row groups).
__device__ __forceinline__ auto act_from_global(const float4* a4, int n8, int lane) {
  return [a4, n8, lane](int c, float4& a, float4& b) {
    const int i = lane + 32 * c;
    a = i < n8 ? load_act(a4 + 2 * i) : make_float4(0.f, 0.f, 0.f, 0.f);
    b = i < n8 ? load_act(a4 + 2 * i + 1) : make_float4(0.f, 0.f, 0.f, 0.f);
  };
}

// The block's rows after every slot's part: out[h0 + r] = out_old + sum_j weights[j] · part[j][r],
// the slots in order. Contains the __syncthreads that makes part visible.
__device__ __forceinline__ void down_finish(const float (*part)[k_down_rows], const float* __restrict__ weights, int k, int nrows,
                                            int h0, float out_old, float* __restrict__ out) {
  __syncthreads();
  SERVEDECK_TRACE_SUMMED();
  if (static_cast<int>(threadIdx.x) < nrows) {
    float tot = 0.f;
    for (int j = 0; j < k; ++j) tot += weights[j] * part[j][threadIdx.x];
    out[h0 + threadIdx.x] = out_old + tot;
  }
}

template <int CH>
__global__ void __launch_bounds__(k_moe_warps * 32, 2) moe_down_rows_kernel(ExpertTable t, const float* __restrict__ act,
                                                                           const int32_t* __restrict__ ids,
                                                                           const float* __restrict__ weights, int k,
                                                                           float* __restrict__ out) {
  SERVEDECK_TRACE_BLOCK();
  constexpr int RG = 8;
  __shared__ float part[32][k_down_rows];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int h0 = blockIdx.x * k_down_rows, nrows = min(k_down_rows, t.hidden - h0), n8 = t.inter / 8;
  uint4 w[RG][CH];
  const uint4* rows = nullptr;
  auto select = [&](int j) {
    rows = reinterpret_cast<const uint4*>(t.experts[__ldcg(ids + j)] + static_cast<size_t>(2) * t.inter * t.hidden + static_cast<size_t>(h0) * t.inter);
  };
  auto load = [&](int g) {
#pragma unroll
    for (int r = 0; r < RG; ++r)
#pragma unroll
      for (int c = 0; c < CH; ++c) {
        const int i = lane + 32 * c;
        w[r][c] = g + r < nrows && i < n8 ? rows[static_cast<size_t>(g + r) * n8 + i] : make_uint4(0, 0, 0, 0);
      }
  };
  if (warp < k) {
    select(warp);
    load(0);
  }
  // The residual too: out was last written by the o-proj, three launches back.
  const float out_old = static_cast<int>(threadIdx.x) < nrows ? __ldcg(out + h0 + threadIdx.x) : 0.f;
  wait_for_predecessor();
  for (int j = warp; j < k; j += k_moe_warps) {
    if (j != warp) {
      select(j);
      load(0);
    }
    const float4* a4 = reinterpret_cast<const float4*>(act + static_cast<size_t>(j) * t.inter);
    for (int g = 0; g < nrows; g += RG) {
      if (g > 0) load(g);
      down_row_group<CH, RG>(act_from_global(a4, n8, lane), g, nrows, lane, j, [&](int r, int c) { return w[r][c]; }, part);
    }
  }
  down_finish(part, weights, k, nrows, h0, out_old, out);
}

// down with every row of the block staged in shared memory before the wait: block b owns the
// hidden rows [16 b, 16 b + 16) and copies, for each routed slot j, down_j's rows of the block
// (one contiguous range of 16·inter bf16; k·16·inter·2 bytes, 192 KB at k 8 and inter 768) by
// every thread's cp.async, so the down weights stream while gate/up's last blocks finish. ids and
// the expert pointers are read before the wait (H4, handshakes.cuh), act only after: the warp's
// first slot's act and the routing weights right after the wait, while the rows still land. A
// full group (8 rows of exactly 32·CH column blocks: the benchmark's shape) reads its rows without
// the bounds checks, so the compiler can issue a column block's 8 loads together. The arithmetic
// is moe_down_rows_kernel's, step for step (per lane its CH column blocks in order,
// down_row_group's warp reduction, then the slots in order), so out is bit-identical. Its blocks
// are placed only as gate/up's blocks exit (gate/up's two blocks per SM hold 48K of the 64K
// registers); a 4-warp block of <= 128 registers would fit beside them but measured slower
// (docs/performance.md, 2026-11-30 "staged down").
template <int CH>
__global__ void __launch_bounds__(k_moe_warps * 32, 1) moe_down_staged_kernel(ExpertTable t, const float* __restrict__ act,
                                                                             const int32_t* __restrict__ ids,
                                                                             const float* __restrict__ weights, int k,
                                                                             float* __restrict__ out) {
  SERVEDECK_TRACE_BLOCK();
  constexpr int RG = 8;
  extern __shared__ float4 dyn4[];
  uint4* ws = reinterpret_cast<uint4*>(dyn4);  // [slot][row][n8]
  __shared__ float part[32][k_down_rows];
  __shared__ const bf16* rows_of[32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int h0 = blockIdx.x * k_down_rows, nrows = min(k_down_rows, t.hidden - h0), n8 = t.inter / 8;
  if (static_cast<int>(threadIdx.x) < k)
    rows_of[threadIdx.x] = t.experts[__ldcg(ids + threadIdx.x)] + static_cast<size_t>(2) * t.inter * t.hidden + static_cast<size_t>(h0) * t.inter;
  // The residual too: out was last written by the o-proj, three launches back.
  const float out_old = static_cast<int>(threadIdx.x) < nrows ? __ldcg(out + h0 + threadIdx.x) : 0.f;
  __syncthreads();
  for (int j = 0; j < k; ++j)
    detail::stage_async(ws + static_cast<size_t>(j) * k_down_rows * n8, rows_of[j], static_cast<unsigned>(nrows) * n8 * 16u,
                        static_cast<int>(threadIdx.x), k_moe_warps * 32);
  wait_for_predecessor();
  // While the rows land: this warp's first slot's act and the routing weights (gate/up wrote
  // both), so that no load after the rows waits on L2.
  __shared__ float w_s[32];
  float4 pa[CH], pb[CH];
  if (static_cast<int>(threadIdx.x) < k) w_s[threadIdx.x] = weights[threadIdx.x];
  {
    const float4* a4 = reinterpret_cast<const float4*>(act + static_cast<size_t>(warp < k ? warp : 0) * t.inter);
#pragma unroll
    for (int c = 0; c < CH; ++c) {
      const int i = lane + 32 * c;
      pa[c] = i < n8 ? __ldcg(a4 + 2 * i) : make_float4(0.f, 0.f, 0.f, 0.f);
      pb[c] = i < n8 ? __ldcg(a4 + 2 * i + 1) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
  }
  detail::stage_wait_all();
  __syncthreads();
  SERVEDECK_TRACE_STAGED();
  for (int j = warp; j < k; j += k_moe_warps) {
    const float4* a4 = reinterpret_cast<const float4*>(act + static_cast<size_t>(j) * t.inter);
    const uint4* wj = ws + static_cast<size_t>(j) * k_down_rows * n8;
    for (int g = 0; g < nrows; g += RG) {
      const auto weight = [&](int r, int c) {
        const int i = lane + 32 * c;
        return g + r < nrows && i < n8 ? wj[static_cast<size_t>(g + r) * n8 + i] : make_uint4(0, 0, 0, 0);
      };
      const auto weight_full = [&](int r, int c) { return wj[static_cast<size_t>(g + r) * n8 + lane + 32 * c]; };
      const bool full = g + RG <= nrows && n8 == 32 * CH;
      if (j == warp) {
        const auto act_pre = [&](int c, float4& a, float4& b) { a = pa[c], b = pb[c]; };
        if (full) down_row_group<CH, RG>(act_pre, g, nrows, lane, j, weight_full, part);
        else down_row_group<CH, RG>(act_pre, g, nrows, lane, j, weight, part);
      } else {
        down_row_group<CH, RG>(act_from_global(a4, n8, lane), g, nrows, lane, j, weight, part);
      }
    }
  }
  down_finish(part, w_s, k, nrows, h0, out_old, out);
}

/// Shared memory of moe_down_staged_kernel: k slots of k_down_rows rows of inter bf16.
std::size_t down_staged_smem(int k, int inter) { return static_cast<std::size_t>(k) * k_down_rows * static_cast<std::size_t>(inter) * 2; }
constexpr std::size_t k_down_staged_smem_max = 200 * 1024;

}  // namespace

void launch_moe_down_fused(const ExpertTable& table, const float* act, const int32_t* ids, const float* weights, int k,
                           float* out, cudaStream_t stream, bool pdl) {
  detail::require(table.hidden % 8 == 0 && table.inter % 8 == 0 && k > 0 && k <= 32, "launch_moe_down_fused",
                  "hidden and inter must be multiples of 8 and k in (0, 32], got " + std::to_string(table.hidden) + ", " +
                      std::to_string(table.inter) + ", " + std::to_string(k));
  detail::require(detail::aligned16(act), "launch_moe_down_fused", "act must be 16-byte aligned");
  const int n8 = table.inter / 8;
  const int blocks = (table.hidden + k_down_rows - 1) / k_down_rows;
  // The staged down where its rows fit the block's shared memory (docs/performance.md,
  // 2026-11-30 "staged down"), else the row kernels.
  const std::size_t smem = down_staged_smem(k, table.inter);
  auto staged = [&](auto kernel) {
    if (smem > k_down_staged_smem_max || !detail::fits_smem(kernel, smem)) return false;
    detail::allow_dynamic_smem(kernel, k_down_staged_smem_max);
    launch(kernel, blocks, k_moe_warps * 32, smem, stream, pdl, table, act, ids, weights, k, out);
    return true;
  };
  if (n8 <= 32 ? staged(moe_down_staged_kernel<1>) : n8 <= 64 ? staged(moe_down_staged_kernel<2>) : n8 <= 96 && staged(moe_down_staged_kernel<3>))
    return;
  if (n8 <= 32) return launch(moe_down_rows_kernel<1>, blocks, k_moe_warps * 32, 0, stream, pdl, table, act, ids, weights, k, out);
  if (n8 <= 64) return launch(moe_down_rows_kernel<2>, blocks, k_moe_warps * 32, 0, stream, pdl, table, act, ids, weights, k, out);
  if (n8 <= 96) return launch(moe_down_rows_kernel<3>, blocks, k_moe_warps * 32, 0, stream, pdl, table, act, ids, weights, k, out);
  launch(moe_down_fused_kernel, grid_for(table.hidden, k_moe_warps), k_moe_warps * 32, 0, stream, pdl, table, act, ids, weights, k, out);
}

}  // namespace servedeck::worker::cuda

SERVEDECK_TRACE_TU_SETTER(set_decode_trace_buffer_fused_moe_down)
