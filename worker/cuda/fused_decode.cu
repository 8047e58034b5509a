// Fused decode kernels: the norm + GEMVs and the o-proj (see fused.cuh for the launch plan per
// layer); the attention is in attention_decode.cu, the routers in fused_router*.cu, the MoE
// expert kernels in fused_moe.cu (gate/up) and fused_moe_down.cu.
#include <cmath>
#include <type_traits>

#include "worker/cuda/block_norm.cuh"
#include "worker/cuda/dot.cuh"
#include "worker/cuda/fused.cuh"
#include "worker/cuda/fused_launch.cuh"
#include "worker/cuda/handshakes.cuh"
#include "worker/cuda/launch_check.cuh"

namespace servedeck::worker::cuda {

namespace {

using bf16 = __nv_bfloat16;
using detail::allow_dynamic_smem;
using detail::grid_for;
using detail::launch;
using detail::sm_count;
using detail::wait_for_predecessor;
using detail::lane_dot;
using detail::warp_max;
using detail::warp_sum;

using detail::block_rmsnorm_to_shared;

template <int WARPS>
__global__ void __launch_bounds__(WARPS * 32) norm_gemv_kernel(const bf16* __restrict__ W, const float* __restrict__ x,
                                                              const bf16* __restrict__ nw, float eps, float* __restrict__ y,
                                                              int out, int in, int accumulate, float* __restrict__ xn_out,
                                                              const float* __restrict__ res) {
  SERVEDECK_TRACE_BLOCK();
  extern __shared__ float4 dyn4[];
  float* xs = reinterpret_cast<float*>(dyn4);
  __shared__ float red[WARPS];
  const int lane = threadIdx.x % 32, row0 = blockIdx.x * WARPS + threadIdx.x / 32;
  // Weights are never written by the predecessor: start loading before waiting for it.
  const detail::RowPrefetch pre = detail::prefetch_row(W + static_cast<size_t>(row0 < out ? row0 : 0) * in, in, lane);
  wait_for_predecessor();
  block_rmsnorm_to_shared<WARPS>(x, nw, eps, in, xs, red);
  if (xn_out != nullptr && blockIdx.x == 0)
    for (int i = threadIdx.x; i < in; i += WARPS * 32) xn_out[i] = xs[i];
  for (int row = row0; row < out; row += gridDim.x * WARPS) {
    const bf16* wr = W + static_cast<size_t>(row) * in;
    const float acc = warp_sum(row == row0 ? detail::lane_dot_prefetched(pre, wr, xs, in, lane) : lane_dot(wr, xs, in, lane));
    if (lane == 0) y[row] = accumulate ? (res != nullptr ? res[row] : y[row]) + acc : acc;
  }
}

// Staged GEMV (batch 1), y (+)= W · x̂ with x̂ = rmsnorm(x) * nw when NV != 0, else x: block b owns
// the rows [b R, b R + R) (R = rows_per_block), one contiguous byte range of W, which all threads
// copy (cp.async, stage_async) into shared memory, so the weights stream while the previous kernel
// still runs (R·in·2 bytes per SM): all of it BEFORE waiting for the predecessor, or with x first
// (x_first) a part before and the rest right after x's loads. Then lane l of column slice s (warp
// w: s = w % 8) takes the 16-byte column blocks c = 32 s + l (+ 256, ...) of 8 rows at a time; per
// row the lane sums its blocks in order, the warp reduces the 8 rows with one reduce-scatter
// (detail::store_row_sums8), and the block adds the 8 slices in order. The reduce-scatter and
// 16 warps (not 8) per block: docs/performance.md, 2026-11-30 "staged GEMV".
// Shared memory: R·in bf16 weights | in fp32 x̂ | CW·R fp32 partials (CW = k_staged_warps column
// slices).
constexpr int k_staged_warps = 8;
constexpr std::size_t k_staged_smem_max = 200 * 1024;

// NV: the norm of x first — 0: none (x copied), > 0: load_row_regs + block_rmsnorm_from_regs
// (block_rmsnorm_prefetched's steps) with NV float4 per thread of the first 256 (its weights
// loaded before the wait; in <= 4 * 256 * NV), -1: block_rmsnorm_to_shared (WARPS 8 only).
// WARPS: 16, or 8 with the strided norm (NV -1): warp w takes column slice w % 8 and, at 16,
// every other group of 8 rows (w / 8 picks which), so each row's partials are those of the
// 8-warp kernel, summed in the same order, with twice the warps to hide the latencies of the
// shared-memory loads and shuffles.
template <int NV>
constexpr int staged_warps() { return NV >= 0 ? 2 * k_staged_warps : k_staged_warps; }

template <int NV, int WARPS = staged_warps<NV>()>
__global__ void __launch_bounds__(WARPS * 32, 16 / WARPS) staged_gemv_kernel(
    const bf16* __restrict__ W, const float* __restrict__ x, const bf16* __restrict__ nw, float eps, float* __restrict__ y,
    int out, int in, int rows_per_block, int accumulate, float* __restrict__ xn_out, int pieces, const float* __restrict__ res,
    int trigger_at_start, int x_first) {
  SERVEDECK_TRACE_BLOCK();
  // The o-proj of a folded-router layer lets the router launch at once (handshakes.cuh).
  if (trigger_at_start) detail::trigger_dependents();
  constexpr int CW = k_staged_warps, RG = 8, NT = CW * 32;  // column slices; the norm's threads
  extern __shared__ float4 dyn4[];
  const int R = rows_per_block, r0 = blockIdx.x * R, nrows = min(R, out - r0), n8 = in / 8;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, cw = warp % CW, half = warp / CW;
  const uint4* ws = reinterpret_cast<const uint4*>(dyn4);
  float* xs = reinterpret_cast<float*>(dyn4 + static_cast<size_t>(R) * n8);
  float* part = xs + in;
  __shared__ float red[WARPS];
  // x first (x_first in 1..7, one piece, NV > 0): only the first x_first eighths of the rows' bytes,
  // rounded down to whole rounds of the block's 16-byte copies, are issued before the wait, the
  // rest after x's loads, so that x is not queued behind them (at the benchmark's q|k|v, 4: 72 KB
  // of 156 KB, 18 of 39 rows). Otherwise head == bytes: all before.
  const unsigned bytes = static_cast<unsigned>(nrows) * n8 * 16u, round = WARPS * 32 * 16u;
  const unsigned head = NV > 0 && pieces <= 1 && x_first > 0 && x_first < 8 ? bytes * x_first / 8u / round * round : bytes;
  detail::stage_async_paced(dyn4, W + static_cast<size_t>(r0) * in, head, static_cast<int>(threadIdx.x), WARPS * 32, pieces);
  detail::NormWeights<(NV > 0 ? NV : 1)> nwp;
  if constexpr (NV > 0) nwp = detail::prefetch_norm_weights<NT, NV>(nw, in);
  // y (or res), when accumulated into, is read before the wait too (see launch_gemv_bf16_pdl).
  const float* base = res != nullptr ? res : y;
  const float y_old = accumulate && static_cast<int>(threadIdx.x) < nrows ? base[r0 + threadIdx.x] : 0.f;
  wait_for_predecessor();
  if constexpr (NV != 0) {
    if constexpr (NV > 0) {
      const detail::RowRegs<NV> xv = detail::load_row_regs<NT, NV>(x, in);
      if (head < bytes)
        detail::stage_async(reinterpret_cast<char*>(dyn4) + head, reinterpret_cast<const char*>(W + static_cast<size_t>(r0) * in) + head,
                            bytes - head, static_cast<int>(threadIdx.x), WARPS * 32);
      detail::block_rmsnorm_from_regs<NT, NV>(xv, nwp, eps, in, xs, red);
    } else {
      block_rmsnorm_to_shared<CW>(x, nw, eps, in, xs, red);
    }
    if (xn_out != nullptr && blockIdx.x == 0)
      for (int i = threadIdx.x; i < in; i += WARPS * 32) xn_out[i] = xs[i];
  } else {
#pragma unroll 4
    for (int i = threadIdx.x * 4; i < in; i += WARPS * 32 * 4)
      *reinterpret_cast<float4*>(xs + i) = *reinterpret_cast<const float4*>(x + i);
  }
  detail::stage_wait_all();
  __syncthreads();  // every thread's copies are visible to the block
  SERVEDECK_TRACE_STAGED();
  const float4* xs4 = reinterpret_cast<const float4*>(xs);
  for (int g = half * RG; g < nrows; g += (WARPS / CW) * RG) {
    float acc[RG];
#pragma unroll
    for (int r = 0; r < RG; ++r) acc[r] = 0.f;
    for (int c = cw * 32 + lane; c < n8; c += CW * 32) {
      const float4 a = xs4[2 * c], b = xs4[2 * c + 1];
#pragma unroll
      for (int r = 0; r < RG; ++r)
        if (g + r < nrows) acc[r] += detail::dot8(ws[static_cast<size_t>(g + r) * n8 + c], a, b);
    }
    detail::store_row_sums8(acc, lane, g, nrows, part + cw * R);
  }
  __syncthreads();
  SERVEDECK_TRACE_SUMMED();
  for (int r = threadIdx.x; r < nrows; r += WARPS * 32) {
    float s = 0.f;
#pragma unroll
    for (int w = 0; w < CW; ++w) s += part[w * R + r];
    y[r0 + r] = accumulate ? (r == static_cast<int>(threadIdx.x) ? y_old : base[r0 + r]) + s : s;
  }
}

// Shape of a staged GEMV launch: rows per block so that one block per SM covers `out`, and its
// shared memory.
struct StagedPlan {
  int rows_per_block = 0, grid = 0;
  std::size_t smem = 0;
};

StagedPlan staged_plan(int out, int in) {
  StagedPlan p;
  p.rows_per_block = (out + sm_count() - 1) / sm_count();
  p.grid = (out + p.rows_per_block - 1) / p.rows_per_block;
  const std::size_t R = static_cast<std::size_t>(p.rows_per_block), n = static_cast<std::size_t>(in);
  p.smem = R * n * 2 + n * 4 + k_staged_warps * R * 4;
  return p;
}

// Launches the staged kernel when its rows fit the block's shared memory (at most
// k_staged_smem_max, and what the device allows: detail::smem_per_block); false otherwise (the
// caller runs the row-per-warp kernel).
template <int NV>
bool launch_staged(cudaStream_t stream, bool pdl, const bf16* W, const float* x, const bf16* nw, float eps, float* y, int out,
                   int in, bool accumulate, float* xn_out, int pieces, const float* res = nullptr, bool trigger_at_start = false,
                   int x_first = 0) {
  const StagedPlan p = staged_plan(out, in);
  const auto kernel = staged_gemv_kernel<NV>;
  if (p.smem > k_staged_smem_max || !detail::fits_smem(kernel, p.smem)) return false;
  allow_dynamic_smem(kernel, k_staged_smem_max);
  launch(kernel, p.grid, staged_warps<NV>() * 32, p.smem, stream, pdl, W, x, nw, eps, y, out, in, p.rows_per_block,
         accumulate ? 1 : 0, xn_out, pieces, res, trigger_at_start ? 1 : 0, x_first);
  return true;
}

// y (+)= W x with x from global memory (o-proj + residual), one row per warp.
__global__ void __launch_bounds__(256) gemv_pdl_kernel(const bf16* __restrict__ W, const float* __restrict__ x,
                                                       float* __restrict__ y, int out, int in, int accumulate,
                                                       const float* __restrict__ res) {
  SERVEDECK_TRACE_BLOCK();
  const int lane = threadIdx.x % 32, row0 = blockIdx.x * 8 + threadIdx.x / 32;
  const detail::RowPrefetch pre = detail::prefetch_row(W + static_cast<size_t>(row0 < out ? row0 : 0) * in, in, lane);
  wait_for_predecessor();
  for (int row = row0; row < out; row += gridDim.x * 8) {
    const bf16* wr = W + static_cast<size_t>(row) * in;
    const float acc = warp_sum(row == row0 ? detail::lane_dot_prefetched(pre, wr, x, in, lane) : lane_dot(wr, x, in, lane));
    if (lane == 0) y[row] = accumulate ? (res != nullptr ? res[row] : y[row]) + acc : acc;
  }
}

}  // namespace

std::vector<float> rope_inv_freq(float theta, int rotary_dim) {
  std::vector<float> f(static_cast<std::size_t>(rotary_dim / 2 > 0 ? rotary_dim / 2 : 1), 0.f);
  for (int i = 0; i < rotary_dim / 2; ++i) {
    const float expo = static_cast<float>(2 * i) / static_cast<float>(rotary_dim);
    f[static_cast<std::size_t>(i)] = 1.0f / static_cast<float>(std::pow(static_cast<double>(theta), static_cast<double>(expo)));
  }
  return f;
}

void launch_norm_gemv_bf16(const bf16* W, const float* x, const bf16* norm_w, float eps, float* y, int out, int in,
                           bool accumulate, float* xn_out, cudaStream_t stream, bool pdl, const float* bias) {
  using detail::require;
  require(bias == nullptr || !accumulate, "launch_norm_gemv_bf16", "a bias cannot be combined with accumulate");
  // y = bias + W x̂: the kernels' accumulation from `res` (bias is a weight: read before the wait).
  const bool acc = accumulate || bias != nullptr;
  require(out > 0 && in > 0, "launch_norm_gemv_bf16", "out and in must be positive, got " + std::to_string(out) + ", " + std::to_string(in));
  require(in % 8 == 0 && in <= 12288, "launch_norm_gemv_bf16", "in must be a multiple of 8 and <= 12288, got " + std::to_string(in));
  require(detail::aligned16(W) && detail::aligned16(x), "launch_norm_gemv_bf16", "W and x must be 16-byte aligned");
  // The staged kernels' prefetch_norm_weights reads four bf16 norm weights at a time (8-byte loads).
  require(detail::aligned8(norm_w), "launch_norm_gemv_bf16", "norm_w must be 8-byte aligned");
  // One piece of copies (pacing them measured no better for q|k|v, which runs beside the
  // bandwidth-bound down) with x first: half of the rows issued before the wait, the rest after
  // x's loads, so that x is not queued behind all of them (docs/performance.md, 2026-11-30
  // "q|k|v x first"). It applies to every staged launch here: also the dense MLP's gate and up.
  constexpr int pieces = 1, x_first = 4;
  // The norm weights of 2 or 4 float4 per thread (256 threads) are loaded before the wait.
  if (in <= 2048 ? launch_staged<2>(stream, pdl, W, x, norm_w, eps, y, out, in, acc, xn_out, pieces, bias, false, x_first)
      : in <= 4096 ? launch_staged<4>(stream, pdl, W, x, norm_w, eps, y, out, in, acc, xn_out, pieces, bias, false, x_first)
                   : launch_staged<-1>(stream, pdl, W, x, norm_w, eps, y, out, in, acc, xn_out, pieces, bias))
    return;
  const std::size_t smem = static_cast<std::size_t>(in) * sizeof(float);
  allow_dynamic_smem(norm_gemv_kernel<8>, 12288 * sizeof(float));  // the precondition's largest `in`
  launch(norm_gemv_kernel<8>, grid_for(out, 8), 256, smem, stream, pdl, W, x, norm_w, eps, y, out, in, acc ? 1 : 0, xn_out, bias);
}

void launch_gemv_bf16_pdl(const bf16* W, const float* x, float* y, int out, int in, bool accumulate, cudaStream_t stream,
                          bool pdl, const float* res, bool trigger_at_start) {
  detail::require(out > 0 && in > 0 && in % 8 == 0, "launch_gemv_bf16_pdl",
                  "out must be positive and in a positive multiple of 8, got " + std::to_string(out) + ", " + std::to_string(in));
  detail::require(detail::aligned16(W) && detail::aligned16(x), "launch_gemv_bf16_pdl", "W and x must be 16-byte aligned");
  // The o-proj stages its rows beside the attention (latency-bound): in 16 paced pieces so its
  // copies do not queue ahead of the attention's loads (docs/performance.md, 2026-11-30 "o-proj
  // paced staging").
  constexpr int pieces = 16;
  if (launch_staged<0>(stream, pdl, W, x, nullptr, 0.f, y, out, in, accumulate, nullptr, pieces, res, trigger_at_start)) return;
  launch(gemv_pdl_kernel, grid_for(out, 8), 256, 0, stream, pdl, W, x, y, out, in, accumulate ? 1 : 0, res);
}

}  // namespace servedeck::worker::cuda

SERVEDECK_TRACE_TU_SETTER(set_decode_trace_buffer_fused_decode)

#ifdef SERVEDECK_DECODE_TRACE
namespace servedeck::worker::cuda {
void set_decode_trace_buffer_attention_decode(DecodeTraceRecord* buf);
void set_decode_trace_buffer_fused_moe(DecodeTraceRecord* buf);
void set_decode_trace_buffer_fused_moe_down(DecodeTraceRecord* buf);
void set_decode_trace_buffer_fused_router(DecodeTraceRecord* buf);
void set_decode_trace_buffer_fused_router_folded(DecodeTraceRecord* buf);
void set_decode_trace_buffer_quant_moe(DecodeTraceRecord* buf);
void set_decode_trace_buffer(DecodeTraceRecord* buf) {
  set_decode_trace_buffer_fused_router_folded(buf);
  set_decode_trace_buffer_fused_decode(buf);
  set_decode_trace_buffer_attention_decode(buf);
  set_decode_trace_buffer_fused_moe(buf);
  set_decode_trace_buffer_fused_moe_down(buf);
  set_decode_trace_buffer_fused_router(buf);
  set_decode_trace_buffer_quant_moe(buf);
}
}  // namespace servedeck::worker::cuda
#endif
