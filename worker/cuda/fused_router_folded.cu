// The decode step's router folded through the o-proj (see fused.cuh, fold_router_weights and
// launch_router_folded): the routing of a MoE layer from the attention's output and the residual
// before the o-proj, so that it runs beside the o-proj instead of after it.
#include <cmath>
#include <string>

#include "worker/cuda/dot.cuh"
#include "worker/cuda/fused.cuh"
#include "worker/cuda/fused_launch.cuh"
#include "worker/cuda/handshakes.cuh"
#include "worker/cuda/launch_check.cuh"

namespace servedeck::worker::cuda {

namespace {

using bf16 = __nv_bfloat16;
using detail::warp_sum;

// One thread per column c of row e (grid: ceil((H + Q) / 256) × E): c < H the router row times
// the norm weights (exact in fp32: both factors are bf16), c = H + q the sum over h, in h order,
// of that product times Wo[h, q] (fp32).
__global__ void fold_router_kernel(const bf16* __restrict__ R, const bf16* __restrict__ w, const bf16* __restrict__ Wo,
                                   float* __restrict__ out, int H, int Q) {
  const int e = blockIdx.y, c = blockIdx.x * blockDim.x + threadIdx.x;
  const bf16* r = R + static_cast<size_t>(e) * H;
  float* row = out + static_cast<size_t>(e) * (H + Q);
  if (c < H) {
    row[c] = __bfloat162float(r[c]) * __bfloat162float(w[c]);
  } else if (c < H + Q) {
    const int q = c - H;
    float acc = 0.f;
    for (int h = 0; h < H; ++h)
      acc += __bfloat162float(r[h]) * __bfloat162float(w[h]) * __bfloat162float(Wo[static_cast<size_t>(h) * Q + q]);
    row[c] = acc;
  }
}

constexpr int k_folded_warps = 8;
constexpr int k_folded_threads = k_folded_warps * 32;
constexpr int k_folded_loads = 8;  // 16-byte weight loads per lane in flight (and as many of the input)

// Block e: the unscaled logit l_e = Rf[e, :] · [h | a]; warp w takes the w-th contiguous slice
// of the row's float4 columns, a lane its columns lane, lane + 32, ... in rounds of
// k_folded_loads loads in flight; the lanes' sums by the shuffle tree, the warps in order. It lets
// gate/up launch at once (handshakes.cuh, launch order); h (the previous layer's residual,
// written by its down) is complete when it runs; a (the attention's output) is read only once
// the heads' count says it is written (H2). The logit is then counted (H3): gate/up's blocks rank
// the logits themselves, so there is no last block here. Block 0 alone waits for the o-proj at
// its end, so that the grid still completes only after it (gate/up's wait covers the o-proj's
// output too). Folded and beside the o-proj, ranked in gate/up: docs/performance.md,
// 2026-11-30 "folded router" and "gate/up ranks".
__global__ void __launch_bounds__(k_folded_threads) router_folded_kernel(const float* __restrict__ Rf, const float* __restrict__ h,
                                                                        const float* a, int H, int Q, float* __restrict__ logits,
                                                                        StepSync sync, int n_heads) {
  SERVEDECK_TRACE_BLOCK();
  __shared__ float red[k_folded_warps];
  detail::trigger_dependents();
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int n4 = (H + Q) / 4, h4 = H / 4, per = (n4 + k_folded_warps - 1) / k_folded_warps;
  const int c0 = warp * per, c1 = min(n4, c0 + per);
  const float4* row = reinterpret_cast<const float4*>(Rf + static_cast<size_t>(blockIdx.x) * (H + Q));
  const float4* h4p = reinterpret_cast<const float4*>(h);
  const float4* a4p = reinterpret_cast<const float4*>(a);
  float acc = 0.f;
  const auto wait_for_heads = [&] {
    if (threadIdx.x == 0) detail::wait_for_count(sync.heads_done, detail::step_target(sync.epoch, static_cast<unsigned>(n_heads)));
    __syncthreads();
  };
  if (per <= 32 * k_folded_loads) {
    // A lane's columns in one round (the benchmark's shape: 6 per lane): every weight and h's
    // columns loaded before the wait for the heads, a's after; the additions in column order.
    float4 w[k_folded_loads], v[k_folded_loads];
#pragma unroll
    for (int m = 0; m < k_folded_loads; ++m) {
      const int c = c0 + lane + 32 * m;
      w[m] = c < c1 ? row[c] : make_float4(0.f, 0.f, 0.f, 0.f);
      v[m] = c < c1 && c < h4 ? h4p[c] : make_float4(0.f, 0.f, 0.f, 0.f);
    }
    wait_for_heads();
#pragma unroll
    for (int m = 0; m < k_folded_loads; ++m) {
      const int c = c0 + lane + 32 * m;
      if (c < c1 && c >= h4) v[m] = __ldcg(a4p + (c - h4));
    }
#pragma unroll
    for (int m = 0; m < k_folded_loads; ++m) acc += w[m].x * v[m].x + w[m].y * v[m].y + w[m].z * v[m].z + w[m].w * v[m].w;
  } else {
    // Wider rows: the lane's columns in rounds, h's columns (all before a's) first, then, once
    // every head is written, a's: the same additions in the same order (a column outside the
    // pass adds +0).
    const auto pass = [&](int lo, int hi) {
      for (int base = c0 + lane; base < c1; base += 32 * k_folded_loads) {
        float4 w[k_folded_loads], v[k_folded_loads];
#pragma unroll
        for (int m = 0; m < k_folded_loads; ++m) {
          const int c = base + 32 * m;
          const bool in = c < c1 && c >= lo && c < hi;
          w[m] = in ? row[c] : make_float4(0.f, 0.f, 0.f, 0.f);
          v[m] = in ? (c < h4 ? h4p[c] : __ldcg(a4p + (c - h4))) : make_float4(0.f, 0.f, 0.f, 0.f);
        }
#pragma unroll
        for (int m = 0; m < k_folded_loads; ++m) acc += w[m].x * v[m].x + w[m].y * v[m].y + w[m].z * v[m].z + w[m].w * v[m].w;
      }
    };
    pass(0, h4);
    wait_for_heads();
    pass(h4, n4);
  }
  acc = warp_sum(acc);
  if (lane == 0) red[warp] = acc;
  __syncthreads();
  if (threadIdx.x == 0) {
    float l = 0.f;
#pragma unroll
    for (int w = 0; w < k_folded_warps; ++w) l += red[w];
    logits[blockIdx.x] = l;
    detail::publish_count(sync.logits_done);  // H3: the same thread wrote the logit
  }
  SERVEDECK_TRACE_STAGED();  // the trace's "staged": this block's logit written
  if (blockIdx.x == 0) detail::wait_only();
}

}  // namespace

void fold_router_weights(const bf16* router, const bf16* post_norm, const bf16* o_proj, float* out, int n_experts, int hidden,
                         int q_dim, cudaStream_t stream) {
  detail::require(n_experts > 0 && n_experts <= 65535 && hidden > 0 && q_dim > 0, "fold_router_weights",
                  "n_experts in (0, 65535], hidden and q_dim positive, got " + std::to_string(n_experts) + ", " +
                      std::to_string(hidden) + ", " + std::to_string(q_dim));
  const dim3 grid(static_cast<unsigned>((hidden + q_dim + 255) / 256), static_cast<unsigned>(n_experts));
  fold_router_kernel<<<grid, 256, 0, stream>>>(router, post_norm, o_proj, out, hidden, q_dim);
  CUDA_CHECK(cudaGetLastError());
}

void launch_router_folded(const float* folded, const float* h, const float* a, int n_experts, int hidden, int q_dim, float* logits,
                          const StepSync& sync, int n_heads, cudaStream_t stream, bool pdl) {
  using detail::require;
  require(n_experts > 0 && n_experts <= 1024, "launch_router_folded", "n_experts must be in (0, 1024], got " + std::to_string(n_experts));
  require(hidden > 0 && hidden % 4 == 0 && q_dim > 0 && q_dim % 4 == 0, "launch_router_folded",
          "hidden and q_dim must be positive multiples of 4, got " + std::to_string(hidden) + ", " + std::to_string(q_dim));
  require(detail::aligned16(folded) && detail::aligned16(h) && detail::aligned16(a), "launch_router_folded",
          "folded, h and a must be 16-byte aligned");
  require(sync.epoch != nullptr && sync.heads_done != nullptr && sync.logits_done != nullptr && n_heads > 0, "launch_router_folded",
          "the step's epoch, heads and logits counters and a positive n_heads must be set, got n_heads " + std::to_string(n_heads));
  detail::launch(router_folded_kernel, n_experts, k_folded_threads, 0, stream, pdl, folded, h, a, hidden, q_dim, logits, sync, n_heads);
}

}  // namespace servedeck::worker::cuda

SERVEDECK_TRACE_TU_SETTER(set_decode_trace_buffer_fused_router_folded)
