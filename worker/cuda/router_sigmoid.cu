// The sigmoid router (glm4_moe; router_sigmoid.cuh): the decode step's fused norm + GEMV whose
// last block picks the experts, and the prefill chunk's per-row pick. Both pick through
// sigmoid_pick, so decode and prefill route identically from the same logits.
#include "worker/cuda/router_sigmoid.cuh"

#include <cmath>
#include <string>

#include "worker/cuda/block_norm.cuh"
#include "worker/cuda/dot.cuh"
#include "worker/cuda/fused_launch.cuh"
#include "worker/cuda/launch_check.cuh"
#include "worker/cuda/router_select.cuh"

namespace servedeck::worker::cuda {

namespace {

using bf16 = __nv_bfloat16;
using detail::allow_dynamic_smem;
using detail::launch;
using detail::wait_for_predecessor;
using detail::warp_sum;

constexpr int k_max_experts = 1024;
constexpr int k_max_groups = 64;
constexpr int k_max_k = 32;

/// Shared memory of one pick.
struct PickSmem {
  float score[k_max_experts];   // sigmoid of the logits
  float choice[k_max_experts];  // score + bias, masked to 0 outside the kept groups
  float group_score[k_max_groups];
  int keep[k_max_groups];
  int ids[k_max_k];
  float vals[k_max_k];
};

/// One token's pick by the whole block (thread t of nthreads) from its logits `lg` (n, any
/// memory the block may read), into sm.ids[0..k) and weights w[0..k) (global). The rule:
/// router_sigmoid.cuh. Contains __syncthreads (every thread of the block must call it); counts
/// the picks when hot_flags is set.
__device__ void sigmoid_pick(const float* lg, int n, int k, const SigmoidRouter& r, PickSmem& sm, int32_t* ids, float* w,
                             const uint8_t* hot_flags, unsigned long long* counters, unsigned long long* layer_counts) {
  const int t = threadIdx.x, nthreads = blockDim.x;
  for (int e = t; e < n; e += nthreads) {
    const float s = 1.0f / (1.0f + expf(-lg[e]));
    sm.score[e] = s;
    sm.choice[e] = s + r.bias[e];
  }
  __syncthreads();
  if (r.n_group > 1) {
    const int per = n / r.n_group;
    for (int g = t; g < r.n_group; g += nthreads) {
      float best = -INFINITY, second = -INFINITY;
      for (int e = g * per; e < (g + 1) * per; ++e) {
        const float c = sm.choice[e];
        if (c > best) {
          second = best;
          best = c;
        } else if (c > second) {
          second = c;
        }
      }
      sm.group_score[g] = best + second;
    }
    __syncthreads();
    for (int g = t; g < r.n_group; g += nthreads) {  // rank among the groups, ties → lower group
      const float v = sm.group_score[g];
      int rank = 0;
      for (int j = 0; j < r.n_group; ++j) rank += (sm.group_score[j] > v || (sm.group_score[j] == v && j < g)) ? 1 : 0;
      sm.keep[g] = rank < r.topk_group;
    }
    __syncthreads();
    for (int e = t; e < n; e += nthreads)
      if (!sm.keep[e / per]) sm.choice[e] = 0.0f;
    __syncthreads();
  }
  detail::block_topk_by_rank(sm.choice, n, k, t, nthreads, sm.ids, sm.vals, -INFINITY);
  __syncthreads();
  if (t < k) {
    const int e = sm.ids[t];
    float sum = 0.f;
    for (int j = 0; j < k; ++j) sum += sm.score[sm.ids[j]];
    const float s = sm.score[e];
    w[t] = (r.renormalise ? s / (sum + 1e-20f) : s) * r.scale;
    ids[t] = e;
    if (hot_flags != nullptr) detail::count_pick(hot_flags, counters, layer_counts, e);
  }
}

// Decode: four warps per block, one router row (expert) per warp, as the softmax router
// (fused_router.cu): rows and norm weights loaded before the PDL wait, then one round of loads
// of x. NV: > 0 prefetched norm with NV float4 per thread, -1 generic.
constexpr int k_warps = 4;
constexpr int k_threads = k_warps * 32;

template <int NV>
__global__ void __launch_bounds__(k_threads) router_sigmoid_kernel(const bf16* __restrict__ R, const float* __restrict__ x,
                                                                   const bf16* __restrict__ nw, float eps, float* __restrict__ xn_out,
                                                                   int n, int hidden, int k, SigmoidRouter r, RouterOutputs o) {
  extern __shared__ float4 dyn4[];
  float* xs = reinterpret_cast<float*>(dyn4);
  __shared__ float red[k_warps];
  __shared__ float lg[k_max_experts];
  __shared__ PickSmem sm;
  __shared__ int is_last;
  const int lane = threadIdx.x % 32, row0 = blockIdx.x * k_warps + threadIdx.x / 32;
  const detail::RowPrefetch pre = detail::prefetch_row(R + static_cast<size_t>(row0 < n ? row0 : 0) * hidden, hidden, lane);
  detail::NormWeights<(NV > 0 ? NV : 1)> nwp;
  if constexpr (NV > 0) nwp = detail::prefetch_norm_weights<k_threads, NV>(nw, hidden);
  wait_for_predecessor();
  if constexpr (NV > 0) detail::block_rmsnorm_prefetched<k_threads, NV>(x, nwp, eps, hidden, xs, red);
  else detail::block_rmsnorm_to_shared<k_warps>(x, nw, eps, hidden, xs, red);
  if (blockIdx.x == 0)
    for (int i = threadIdx.x * 4; i < hidden; i += k_threads * 4)
      *reinterpret_cast<float4*>(xn_out + i) = *reinterpret_cast<const float4*>(xs + i);
  for (int row = row0; row < n; row += gridDim.x * k_warps) {
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
  for (int e = threadIdx.x; e < n; e += k_threads) lg[e] = __ldcg(o.logits + e);
  __syncthreads();
  sigmoid_pick(lg, n, k, r, sm, o.ids, o.weights, o.hot_flags, o.counters, o.layer_counts);
  if (threadIdx.x == 0) *o.done = 0u;  // ready for the next launch
}

template <int NV>
void launch_decode(int blocks, std::size_t smem, cudaStream_t stream, bool pdl, const bf16* R, const float* x, const bf16* norm_w,
                   float eps, float* xn_out, int n_experts, int hidden, int k, const SigmoidRouter& r, const RouterOutputs& o) {
  allow_dynamic_smem(router_sigmoid_kernel<NV>, 12288 * sizeof(float));  // the precondition's largest hidden
  launch(router_sigmoid_kernel<NV>, blocks, k_threads, smem, stream, pdl, R, x, norm_w, eps, xn_out, n_experts, hidden, k, r, o);
}

// Prefill: one block of 128 threads per row.
__global__ void __launch_bounds__(k_threads) router_sigmoid_rows_kernel(const float* __restrict__ logits, int n, int k, SigmoidRouter r,
                                                                        int32_t* ids, float* weights, const uint8_t* hot_flags,
                                                                        unsigned long long* counters, unsigned long long* layer_counts) {
  __shared__ PickSmem sm;
  const size_t row = blockIdx.x;
  sigmoid_pick(logits + row * n, n, k, r, sm, ids + row * k, weights + row * k, hot_flags, counters, layer_counts);
}

void check_shape(const char* who, int n, int k, const SigmoidRouter& r) {
  using detail::require;
  require(n > 0 && n <= k_max_experts, who, "n_experts must be in (0, 1024], got " + std::to_string(n));
  require(k > 0 && k <= n && k <= k_max_k, who, "k must be in (0, min(n_experts, 32)], got " + std::to_string(k));
  require(r.n_group >= 1 && r.n_group <= k_max_groups && n % r.n_group == 0, who,
          "n_group must be in [1, 64] and divide n_experts " + std::to_string(n) + ", got " + std::to_string(r.n_group));
  require(r.topk_group >= 1 && r.topk_group <= r.n_group && k <= r.topk_group * (n / r.n_group), who,
          "topk_group must be in [1, n_group] with k <= topk_group * n_experts / n_group, got topk_group " +
              std::to_string(r.topk_group) + ", n_group " + std::to_string(r.n_group) + ", k " + std::to_string(k));
  require(r.bias != nullptr, who, "the correction bias must be set");
}

}  // namespace

void launch_router_sigmoid_fused(const bf16* R, const float* x, const bf16* norm_w, float eps, float* xn_out, int n_experts, int hidden,
                                 int k, const SigmoidRouter& r, const RouterOutputs& o, cudaStream_t stream, bool pdl) {
  using detail::require;
  check_shape("launch_router_sigmoid_fused", n_experts, k, r);
  require(hidden % 8 == 0 && hidden <= 12288, "launch_router_sigmoid_fused",
          "hidden must be a multiple of 8 and <= 12288, got " + std::to_string(hidden));
  require(detail::aligned16(x) && detail::aligned16(xn_out) && detail::aligned16(R), "launch_router_sigmoid_fused",
          "R, x and xn_out must be 16-byte aligned");
  require(detail::aligned8(norm_w), "launch_router_sigmoid_fused", "norm_w must be 8-byte aligned");
  require(o.done != nullptr, "launch_router_sigmoid_fused", "o.done must be set");
  const int blocks = (n_experts + k_warps - 1) / k_warps;
  const std::size_t smem = static_cast<std::size_t>(hidden) * sizeof(float);
  if (hidden <= 4 * k_threads * 4) return launch_decode<4>(blocks, smem, stream, pdl, R, x, norm_w, eps, xn_out, n_experts, hidden, k, r, o);
  if (hidden <= 4 * k_threads * 8) return launch_decode<8>(blocks, smem, stream, pdl, R, x, norm_w, eps, xn_out, n_experts, hidden, k, r, o);
  launch_decode<-1>(blocks, smem, stream, pdl, R, x, norm_w, eps, xn_out, n_experts, hidden, k, r, o);
}

void launch_router_sigmoid_rows(const float* logits, int rows, int n, int k, const SigmoidRouter& r, int32_t* ids, float* weights,
                                const uint8_t* hot_flags, unsigned long long* counters, unsigned long long* layer_counts,
                                cudaStream_t stream) {
  check_shape("launch_router_sigmoid_rows", n, k, r);
  if (rows <= 0) return;
  router_sigmoid_rows_kernel<<<rows, k_threads, 0, stream>>>(logits, n, k, r, ids, weights, hot_flags, counters, layer_counts);
  detail::check_launch();
}

}  // namespace servedeck::worker::cuda
