// Fused decode router (see fused.cuh, launch 4 of a MoE layer): post-attention RMSNorm + router
// GEMV; the last block to finish computes softmax and the top-k and folds the counters.
#include <cmath>

#include "worker/cuda/block_norm.cuh"
#include "worker/cuda/dot.cuh"
#include "worker/cuda/fused.cuh"
#include "worker/cuda/fused_launch.cuh"
#include "worker/cuda/launch_check.cuh"
#include "worker/cuda/router_select.cuh"

namespace servedeck::worker::cuda {

namespace {

using bf16 = __nv_bfloat16;
using detail::allow_dynamic_smem;
using detail::launch;
using detail::wait_for_predecessor;
using detail::warp_softmax_inplace;
using detail::warp_sum;

// Four warps per block, one router row (expert) per warp: 32 blocks for 128 experts. Before the
// wait each warp loads its row (prefetch_row: all of it for hidden <= 2048) and each thread its
// norm weights; after it, one round of loads of x (64 blocks of 2 warps with strided norm loops
// held the critical path 9.5 µs after their wait for a 0.5 MB GEMV: docs/performance.md,
// 2026-11-29 "gate/up grid", the same trace). Four warps (not eight) so that the gate/up blocks launched
// beside it (two per SM, ~96 registers each) still fit on the SMs it occupies.
constexpr int k_router_warps = 4;
constexpr int k_router_threads = k_router_warps * 32;

// NV as staged_gemv_kernel: > 0 prefetched norm with NV float4 per thread, -1 generic.
template <int NV>
__global__ void __launch_bounds__(k_router_threads) router_fused_kernel(
    const bf16* __restrict__ R, const float* __restrict__ x, const bf16* __restrict__ nw, float eps,
    float* __restrict__ xn_out, int n, int hidden, int k, int renormalise, RouterOutputs o) {
  SERVEDECK_TRACE_BLOCK();
  extern __shared__ float4 dyn4[];
  float* xs = reinterpret_cast<float*>(dyn4);
  __shared__ float red[k_router_warps];
  __shared__ float p[1024];
  __shared__ int pick_id[32];
  __shared__ float pick_p[32];
  __shared__ int is_last;
  const int lane = threadIdx.x % 32, row0 = blockIdx.x * k_router_warps + threadIdx.x / 32;
  const detail::RowPrefetch pre = detail::prefetch_row(R + static_cast<size_t>(row0 < n ? row0 : 0) * hidden, hidden, lane);
  detail::NormWeights<(NV > 0 ? NV : 1)> nwp;
  if constexpr (NV > 0) nwp = detail::prefetch_norm_weights<k_router_threads, NV>(nw, hidden);
  wait_for_predecessor();
  if constexpr (NV > 0) detail::block_rmsnorm_prefetched<k_router_threads, NV>(x, nwp, eps, hidden, xs, red);
  else detail::block_rmsnorm_to_shared<k_router_warps>(x, nw, eps, hidden, xs, red);
  if (blockIdx.x == 0)
    for (int i = threadIdx.x * 4; i < hidden; i += k_router_threads * 4)
      *reinterpret_cast<float4*>(xn_out + i) = *reinterpret_cast<const float4*>(xs + i);
  for (int row = row0; row < n; row += gridDim.x * k_router_warps) {
    const bf16* wr = R + static_cast<size_t>(row) * hidden;
    const float acc = warp_sum(row == row0 ? detail::lane_dot_prefetched(pre, wr, xs, hidden, lane) : detail::lane_dot(wr, xs, hidden, lane));
    if (lane == 0) o.logits[row] = acc;
  }
  // Last-block pattern: every block publishes its logits, then counts itself done.
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) is_last = atomicAdd(o.done, 1u) == gridDim.x - 1;
  __syncthreads();
  if (!is_last) return;
  __threadfence();
  for (int e = threadIdx.x; e < n; e += k_router_threads) p[e] = __ldcg(o.logits + e);
  __syncthreads();
  if (threadIdx.x < 32) warp_softmax_inplace(p, n, lane);
  __syncthreads();
  // Top-k by rank over the block (the picks and order of k warp_argmax rounds), then the
  // renormalisation sum in pick order.
  detail::block_topk_by_rank(p, n, k, threadIdx.x, k_router_threads, pick_id, pick_p);
  __syncthreads();
  if (threadIdx.x < k) {
    const int e = pick_id[threadIdx.x];
    o.ids[threadIdx.x] = e;
    detail::count_pick(o.hot_flags, o.counters, o.layer_counts, e);
    float chosen_sum = 0.f;
    for (int r = 0; r < k; ++r) chosen_sum += pick_p[r];
    o.weights[threadIdx.x] = renormalise ? pick_p[threadIdx.x] / chosen_sum : pick_p[threadIdx.x];
  }
  if (threadIdx.x == 0) *o.done = 0u;  // ready for the next launch (the next kernel in the stream starts after this one)
}

template <int NV>
void launch_router(int blocks, std::size_t smem, cudaStream_t stream, bool pdl, const bf16* R, const float* x, const bf16* norm_w,
                   float eps, float* xn_out, int n_experts, int hidden, int k, bool renormalise, const RouterOutputs& o) {
  allow_dynamic_smem(router_fused_kernel<NV>, 12288 * sizeof(float));  // the precondition's largest hidden
  launch(router_fused_kernel<NV>, blocks, k_router_threads, smem, stream, pdl, R, x, norm_w, eps, xn_out, n_experts, hidden, k,
         renormalise ? 1 : 0, o);
}

}  // namespace

void launch_router_fused(const bf16* R, const float* x, const bf16* norm_w, float eps, float* xn_out, int n_experts,
                         int hidden, int k, bool renormalise, const RouterOutputs& o, cudaStream_t stream, bool pdl) {
  using detail::require;
  require(n_experts > 0 && n_experts <= 1024, "launch_router_fused", "n_experts must be in (0, 1024], got " + std::to_string(n_experts));
  require(k > 0 && k <= n_experts && k <= 32, "launch_router_fused", "k must be in (0, min(n_experts, 32)], got " + std::to_string(k));
  require(hidden % 8 == 0 && hidden <= 12288, "launch_router_fused", "hidden must be a multiple of 8 and <= 12288, got " + std::to_string(hidden));
  require(detail::aligned16(x) && detail::aligned16(xn_out) && detail::aligned16(R), "launch_router_fused",
          "R, x and xn_out must be 16-byte aligned");
  // prefetch_norm_weights reads four bf16 norm weights at a time (8-byte loads).
  require(detail::aligned8(norm_w), "launch_router_fused", "norm_w must be 8-byte aligned");
  const int blocks = (n_experts + k_router_warps - 1) / k_router_warps;
  const std::size_t smem = static_cast<std::size_t>(hidden) * sizeof(float);
  if (hidden <= 4 * k_router_threads * 4)
    return launch_router<4>(blocks, smem, stream, pdl, R, x, norm_w, eps, xn_out, n_experts, hidden, k, renormalise, o);
  if (hidden <= 4 * k_router_threads * 8)
    return launch_router<8>(blocks, smem, stream, pdl, R, x, norm_w, eps, xn_out, n_experts, hidden, k, renormalise, o);
  launch_router<-1>(blocks, smem, stream, pdl, R, x, norm_w, eps, xn_out, n_experts, hidden, k, renormalise, o);
}

}  // namespace servedeck::worker::cuda

SERVEDECK_TRACE_TU_SETTER(set_decode_trace_buffer_fused_router)
