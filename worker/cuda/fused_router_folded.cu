// The decode step's router folded through the o-proj (see fused.cuh, fold_router_weights and
// launch_router_folded): the routing of a MoE layer from the attention's output and the residual
// before the o-proj, so that it runs beside the o-proj instead of after it.
#include <cmath>
#include <string>

#include "worker/cuda/dot.cuh"
#include "worker/cuda/fused.cuh"
#include "worker/cuda/fused_launch.cuh"
#include "worker/cuda/launch_check.cuh"
#include "worker/cuda/router_select.cuh"

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
// k_folded_loads loads in flight; the lanes' sums by the shuffle tree, the warps in order. Then
// the last block of the grid ranks the raw logits (the top-k does not depend on the positive
// factor 1/rms that separates them from the router's), writes the ids in rank order and folds
// the counters. All of it before the wait: h (the previous layer's residual, written by its
// down) and a (the attention, two launches back) are complete when this kernel is launched (by
// the o-proj's trigger, after the o-proj's own wait) — or, with heads_done (the early routing,
// fused_launch.cuh: launched at the o-proj's start), a is read only once the heads' count is
// complete. It lets gate/up launch at once and waits for the o-proj at its end (with heads_done
// only its last block), so that gate/up's wait covers the o-proj's output too. Measured on
// the H200 (session 8, GPU step at position ~190): this design 2.549 ms (run 6); triggering
// gate/up after the logit instead 2.669 (run 8) and ranking the logits in gate/up's and down's
// blocks instead of a last block 2.616 (run 9), each run's unfolded router at 2.714-2.715.
__global__ void __launch_bounds__(k_folded_threads) router_folded_kernel(const float* __restrict__ Rf, const float* __restrict__ h,
                                                                        const float* a, int H, int Q, int k,
                                                                        RouterOutputs o, unsigned int* heads_done, int n_heads,
                                                                        int preload, int lean_sync, unsigned int* logits_done) {
  SERVEDECK_TRACE_BLOCK();
  __shared__ float red[k_folded_warps];
  __shared__ float p[1024];
  __shared__ int pick_id[32];
  __shared__ float pick_v[32];
  __shared__ int is_last;
  asm volatile("griddepcontrol.launch_dependents;" :::);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, n = gridDim.x;
  const int n4 = (H + Q) / 4, h4 = H / 4, per = (n4 + k_folded_warps - 1) / k_folded_warps;
  const int c0 = warp * per, c1 = min(n4, c0 + per);
  const float4* row = reinterpret_cast<const float4*>(Rf + static_cast<size_t>(blockIdx.x) * (H + Q));
  const float4* h4p = reinterpret_cast<const float4*>(h);
  const float4* a4p = reinterpret_cast<const float4*>(a);
  float acc = 0.f;
  // The lane's columns in order; with heads_done (the early routing) in two passes, h's columns
  // (all before a's) and then, once every head is written, a's: the same additions in the same
  // order (a column outside the pass adds +0).
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
  const auto wait_for_heads = [&] {
    if (threadIdx.x == 0) detail::wait_for_count(heads_done, static_cast<unsigned int>(n_heads));
    __syncthreads();
  };
  if (heads_done == nullptr) {
    pass(0, n4);
  } else if (preload && per <= 32 * k_folded_loads) {
    // A lane's columns in one round (the benchmark's shape: 6 per lane): every weight and h's
    // columns loaded before the wait for the heads, a's after; then pass(0, n4)'s sum exactly.
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
    o.logits[blockIdx.x] = l;
  }
  SERVEDECK_TRACE_STAGED();  // the trace's "staged": this block's logit written
  if (logits_done != nullptr) {
    // gate/up ranks (fused_launch.cuh): the logit counted, no last block; block 0 alone waits for
    // the o-proj, so that the grid still completes only after it.
    if (threadIdx.x == 0) detail::publish_count(logits_done);
    if (blockIdx.x != 0) return;
    detail::wait_for_predecessor();
    return;
  }
  // Last-block pattern, as the fused router.
  if (detail::arrive_last(o.done, 0, static_cast<unsigned>(n), lean_sync, is_last)) {
    for (int e = threadIdx.x; e < n; e += k_folded_threads) p[e] = __ldcg(o.logits + e);
    __syncthreads();
    detail::block_topk_by_rank(p, n, k, threadIdx.x, k_folded_threads, pick_id, pick_v, -INFINITY);
    __syncthreads();
    const int e = static_cast<int>(threadIdx.x) < k ? pick_id[threadIdx.x] : 0;
    if (static_cast<int>(threadIdx.x) < k) o.ids[threadIdx.x] = e;
    // The counters after the ids' publication when there is one (nothing reads them in the step).
    const auto count = [&] {
      if (static_cast<int>(threadIdx.x) < k) {
        detail::count_pick(o.hot_flags, o.counters, o.layer_counts, e);
      }
    };
    if (o.ids_ready == nullptr) count();
    if (threadIdx.x == 0) *o.done = 0u;  // ready for the next launch
    SERVEDECK_TRACE_SUMMED();  // the trace's "summed": the ids ranked and written
    if (heads_done != nullptr && threadIdx.x == 0) *heads_done = 0u;  // every block has read it
    if (o.ids_ready != nullptr) {  // the early-ids handshake (fused_launch.cuh): every id written first
      __syncthreads();
      if (threadIdx.x == 0) detail::publish_flag(o.ids_ready);
      count();
    }
  } else if (heads_done != nullptr) {
    return;  // the last block's wait alone keeps the grid from completing before the o-proj
  }
  detail::wait_for_predecessor();
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

void launch_router_folded(const float* folded, const float* h, const float* a, int n_experts, int hidden, int q_dim, int k,
                          const RouterOutputs& o, cudaStream_t stream, bool pdl, unsigned int* heads_done, int n_heads,
                          unsigned int* logits_done) {
  using detail::require;
  require(n_experts > 0 && n_experts <= 1024, "launch_router_folded", "n_experts must be in (0, 1024], got " + std::to_string(n_experts));
  require(k > 0 && k <= n_experts && k <= 32, "launch_router_folded", "k must be in (0, min(n_experts, 32)], got " + std::to_string(k));
  require(hidden > 0 && hidden % 4 == 0 && q_dim > 0 && q_dim % 4 == 0, "launch_router_folded",
          "hidden and q_dim must be positive multiples of 4, got " + std::to_string(hidden) + ", " + std::to_string(q_dim));
  require(detail::aligned16(folded) && detail::aligned16(h) && detail::aligned16(a), "launch_router_folded",
          "folded, h and a must be 16-byte aligned");
  require(heads_done == nullptr || n_heads > 0, "launch_router_folded", "n_heads must be positive with heads_done, got " + std::to_string(n_heads));
  // With heads_done, the weights and h's columns loaded before the wait for the heads unless
  // SERVEDECK_ROUTER_PRELOAD=0 (A/B; 0 also runs the general two passes).
  const int preload = detail::env_knob("SERVEDECK_ROUTER_PRELOAD", 1) != 0 ? 1 : 0;
  detail::launch(router_folded_kernel, n_experts, k_folded_threads, 0, stream, pdl, folded, h, a, hidden, q_dim, k, o, heads_done, n_heads,
                 preload, detail::lean_sync_knob(), logits_done);
}

}  // namespace servedeck::worker::cuda

SERVEDECK_TRACE_TU_SETTER(set_decode_trace_buffer_fused_router_folded)
