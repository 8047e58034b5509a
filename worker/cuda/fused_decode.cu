// Fused decode kernels of attention and routing (see fused.cuh for the launch plan per layer);
// the MoE expert kernels are in fused_moe.cu (gate/up) and fused_moe_down.cu.
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
                                                              int out, int in, int accumulate, float* __restrict__ xn_out) {
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
    if (lane == 0) y[row] = accumulate ? y[row] + acc : acc;
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

// Fused attention: k_attention_splits blocks per query head, k_attn_warps warps each; global
// warp g of a head takes positions g, g + G, g + 2G, ... (G = splits × warps) with an online
// softmax; warps merge in a fixed order inside the block, blocks publish partials, and the last
// block of the head to finish merges them in split order (handshakes.cuh H1: the same result
// whichever is last). VPL: head dimensions per lane (lane l holds l, l + 32, ...): 4 for head_dim
// <= 128, else 8; the smaller instance holds 64 registers instead of 88. Before the wait, each
// warp asks L2 for the K and V rows of its first four positions (rows of earlier steps: never
// written by the predecessor), so that its loads after the wait hit L2 (docs/performance.md,
// 2026-11-30 "attention read-ahead").
constexpr int k_attn_warps = 8;

template <int VPL>
__global__ void __launch_bounds__(k_attn_warps * 32) attention_fused_kernel(const float* __restrict__ qkv,
                                                                           const bf16* __restrict__ qn,
                                                                           const bf16* __restrict__ kn, float* kc,
                                                                           float* vc, float* __restrict__ out,
                                                                           AttentionShape s, const int32_t* pos_p,
                                                                           unsigned int* heads_done) {
  SERVEDECK_TRACE_BLOCK();
  // The o-proj may launch at once (handshakes.cuh, launch order): its blocks are placed as
  // q|k|v's leave and stage their rows during the whole attention (docs/performance.md,
  // 2026-11-30 "o-proj at the attention's start").
  detail::trigger_dependents();
  __shared__ float qs[256], ks[256], vs[256];
  __shared__ float wm[k_attn_warps], wl[k_attn_warps];
  __shared__ float wacc[k_attn_warps][32 * VPL];
  __shared__ int is_last;
  const int h = blockIdx.x / k_attention_splits, split = blockIdx.x % k_attention_splits;
  const int hd = s.head_dim, group = s.n_heads / s.n_kv_heads, kvh = h / group;
  const int kv_dim = s.n_kv_heads * hd, q_dim = s.n_heads * hd;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  constexpr int G = k_attention_splits * k_attn_warps;
  // Before the wait: the position (written by the host before the step), the norm weights and
  // inverse frequencies (never written).
  const int pos = *pos_p;
  detail::RopeHeadPrefetch rp{};
  if (warp < 2) rp = detail::prefetch_rope_head(warp == 0 ? qn : kn, s.inv_freq, hd, s.rotary_dim, lane);
  const int tw = split * k_attn_warps + warp;  // this warp's first position
  {
    // Lane l: position tw + (l / 8) G, K (l % 8 < 4) or V, the (l % 4)-th 128-byte line of the row
    // (the first 512 bytes: all of it at head_dim 128).
    const int t = tw + (lane / 8) * G, line = lane % 4;
    if (t < pos && line * 32 < hd) {
      const float* row = ((lane % 8) < 4 ? kc : vc) + static_cast<size_t>(t) * kv_dim + kvh * hd + line * 32;
      asm volatile("prefetch.global.L2 [%0];" ::"l"(row));
    }
  }
  wait_for_predecessor();
  if (warp == 0) detail::norm_rope_head_prefetched(qkv + static_cast<size_t>(h) * hd, rp, qn != nullptr, qs, hd, s.rotary_dim, s.eps, pos, lane);
  if (warp == 1)
    detail::norm_rope_head_prefetched(qkv + q_dim + static_cast<size_t>(kvh) * hd, rp, kn != nullptr, ks, hd, s.rotary_dim, s.eps, pos, lane);
  if (warp == 2)
    for (int i = lane; i < hd; i += 32) vs[i] = qkv[q_dim + kv_dim + kvh * hd + i];
  __syncthreads();
  const size_t row = static_cast<size_t>(pos) * kv_dim + static_cast<size_t>(kvh) * hd;
  if (h % group == 0 && split == 0)
    for (int i = threadIdx.x; i < hd; i += blockDim.x) {
      kc[row + i] = ks[i];
      vc[row + i] = vs[i];
    }
  const float scale = rsqrtf(static_cast<float>(hd));
  float q[VPL], acc[VPL];
#pragma unroll
  for (int i = 0; i < VPL; ++i) {
    q[i] = lane + 32 * i < hd ? qs[lane + 32 * i] : 0.f;
    acc[i] = 0.f;
  }
  float m = -INFINITY, l = 0.f;
  // Four positions at a time so that eight rows' loads are in flight before the first reduction.
  for (int t0 = tw; t0 <= pos; t0 += 4 * G) {
    float d[4], vv[4][VPL];
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int t = t0 + u * G;
      const bool ok = t <= pos;
      const float* kt = t == pos ? ks : kc + static_cast<size_t>(ok ? t : 0) * kv_dim + kvh * hd;
      const float* vt = t == pos ? vs : vc + static_cast<size_t>(ok ? t : 0) * kv_dim + kvh * hd;
      d[u] = 0.f;
#pragma unroll
      for (int i = 0; i < VPL; ++i) {
        const bool in = ok && lane + 32 * i < hd;
        d[u] += in ? q[i] * kt[lane + 32 * i] : 0.f;
        vv[u][i] = in ? vt[lane + 32 * i] : 0.f;
      }
    }
#pragma unroll
    for (int u = 0; u < 4; ++u) d[u] = warp_sum(d[u]) * scale;
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      if (t0 + u * G > pos) break;
      const float mn = fmaxf(m, d[u]);
      const float corr = expf(m - mn), pe = expf(d[u] - mn);
      l = l * corr + pe;
#pragma unroll
      for (int i = 0; i < VPL; ++i) acc[i] = acc[i] * corr + pe * vv[u][i];
      m = mn;
    }
  }
  if (lane == 0) {
    wm[warp] = m;
    wl[warp] = l;
  }
#pragma unroll
  for (int i = 0; i < VPL; ++i)
    if (lane + 32 * i < hd) wacc[warp][lane + 32 * i] = acc[i];
  __syncthreads();
  // Block partial: M, L and the unnormalised output, in warp order.
  float* part = s.scratch + static_cast<size_t>(blockIdx.x) * (hd + 2);
  float M = -INFINITY;
  for (int w = 0; w < k_attn_warps; ++w) M = fmaxf(M, wm[w]);
  for (int dd = threadIdx.x; dd < hd; dd += blockDim.x) {
    float o = 0.f;
    for (int w = 0; w < k_attn_warps; ++w) o += wl[w] > 0.f ? wacc[w][dd] * expf(wm[w] - M) : 0.f;
    part[2 + dd] = o;
  }
  if (threadIdx.x == 0) {
    float L = 0.f;
    for (int w = 0; w < k_attn_warps; ++w) L += wl[w] > 0.f ? wl[w] * expf(wm[w] - M) : 0.f;
    part[0] = M;
    part[1] = L;
  }
  if (!detail::arrive_last(s.counters, h, k_attention_splits, is_last)) return;
  // Every split's (M, L) and this thread's outputs in one round of loads, then the merge in
  // split order.
  const float* hp = s.scratch + static_cast<size_t>(h) * k_attention_splits * (hd + 2);
  for (int dd = threadIdx.x; dd < hd; dd += blockDim.x) {
    float Mb[k_attention_splits], Lb[k_attention_splits], Ob[k_attention_splits];
#pragma unroll
    for (int b = 0; b < k_attention_splits; ++b) {
      Mb[b] = __ldcg(hp + b * (hd + 2));
      Lb[b] = __ldcg(hp + b * (hd + 2) + 1);
      Ob[b] = __ldcg(hp + b * (hd + 2) + 2 + dd);
    }
    float MM = -INFINITY;
#pragma unroll
    for (int b = 0; b < k_attention_splits; ++b) MM = fmaxf(MM, Mb[b]);
    float LL = 0.f;
#pragma unroll
    for (int b = 0; b < k_attention_splits; ++b) LL += Lb[b] > 0.f ? Lb[b] * expf(Mb[b] - MM) : 0.f;
    float o = 0.f;
#pragma unroll
    for (int b = 0; b < k_attention_splits; ++b) o += Lb[b] > 0.f ? Ob[b] * expf(Mb[b] - MM) : 0.f;
    out[static_cast<size_t>(h) * hd + dd] = o / LL;
  }
  if (threadIdx.x == 0) s.counters[h] = 0u;  // H1's reset, by the block that completed the count
  if (heads_done != nullptr) {  // H2 (handshakes.cuh): this head's output is written
    __syncthreads();
    if (threadIdx.x == 0) detail::publish_count(heads_done);
  }
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
                           bool accumulate, float* xn_out, cudaStream_t stream, bool pdl) {
  using detail::require;
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
  if (in <= 2048 ? launch_staged<2>(stream, pdl, W, x, norm_w, eps, y, out, in, accumulate, xn_out, pieces, nullptr, false, x_first)
      : in <= 4096 ? launch_staged<4>(stream, pdl, W, x, norm_w, eps, y, out, in, accumulate, xn_out, pieces, nullptr, false, x_first)
                   : launch_staged<-1>(stream, pdl, W, x, norm_w, eps, y, out, in, accumulate, xn_out, pieces))
    return;
  const std::size_t smem = static_cast<std::size_t>(in) * sizeof(float);
  allow_dynamic_smem(norm_gemv_kernel<8>, 12288 * sizeof(float));  // the precondition's largest `in`
  launch(norm_gemv_kernel<8>, grid_for(out, 8), 256, smem, stream, pdl, W, x, norm_w, eps, y, out, in, accumulate ? 1 : 0, xn_out);
}

void launch_attention_decode_fused(const float* qkv, const bf16* q_norm, const bf16* k_norm, float* k_cache,
                                   float* v_cache, float* out, const AttentionShape& s, const int32_t* pos,
                                   cudaStream_t stream, bool pdl, unsigned int* heads_done) {
  using detail::require;
  require(s.head_dim > 0 && s.head_dim <= 256, "launch_attention_decode_fused",
          "head_dim must be in (0, 256], got " + std::to_string(s.head_dim));
  require(s.n_kv_heads > 0 && s.n_heads % s.n_kv_heads == 0, "launch_attention_decode_fused",
          "n_heads (" + std::to_string(s.n_heads) + ") must be a multiple of n_kv_heads (" + std::to_string(s.n_kv_heads) + ")");
  require(s.rotary_dim >= 0 && s.rotary_dim <= s.head_dim && s.rotary_dim % 2 == 0, "launch_attention_decode_fused",
          "rotary_dim must be even and in [0, head_dim], got " + std::to_string(s.rotary_dim));
  require((q_norm == nullptr) == (k_norm == nullptr), "launch_attention_decode_fused", "q_norm and k_norm must both be set or both null");
  require(s.scratch != nullptr && s.counters != nullptr, "launch_attention_decode_fused", "scratch and counters must be set");
  const int grid = s.n_heads * k_attention_splits;
  auto go = [&](auto kernel) { launch(kernel, grid, k_attn_warps * 32, 0, stream, pdl, qkv, q_norm, k_norm, k_cache, v_cache, out, s, pos, heads_done); };
  if (s.head_dim <= 128) return go(attention_fused_kernel<4>);
  go(attention_fused_kernel<8>);
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
void set_decode_trace_buffer_fused_moe(DecodeTraceRecord* buf);
void set_decode_trace_buffer_fused_moe_down(DecodeTraceRecord* buf);
void set_decode_trace_buffer_fused_router(DecodeTraceRecord* buf);
void set_decode_trace_buffer_fused_router_folded(DecodeTraceRecord* buf);
void set_decode_trace_buffer(DecodeTraceRecord* buf) {
  set_decode_trace_buffer_fused_router_folded(buf);
  set_decode_trace_buffer_fused_decode(buf);
  set_decode_trace_buffer_fused_moe(buf);
  set_decode_trace_buffer_fused_moe_down(buf);
  set_decode_trace_buffer_fused_router(buf);
}
}  // namespace servedeck::worker::cuda
#endif
