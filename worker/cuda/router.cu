// MoE router for one token: softmax over expert logits, top-k, optional renormalisation
// (Qwen3-MoE: softmax → top-k → divide by the top-k sum when norm_topk_prob).
#include <cmath>

#include "worker/cuda/kernels.cuh"
#include "worker/cuda/launch_check.cuh"
#include "worker/cuda/router_select.cuh"

namespace servedeck::worker::cuda {

namespace {

__global__ void router_topk_kernel(const float* __restrict__ logits, int n, int k, int renormalise, int32_t* ids,
                                   float* weights) {
  __shared__ float p[1024];
  __shared__ float red_v[32];
  __shared__ int red_i[32];
  const int tid = threadIdx.x;
  float v = tid < n ? logits[tid] : -INFINITY;
  // max
  float m = v;
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  if (tid % 32 == 0) red_v[tid / 32] = m;
  __syncthreads();
  if (tid < 32) {
    float w = tid < blockDim.x / 32 ? red_v[tid] : -INFINITY;
    for (int o = 16; o > 0; o >>= 1) w = fmaxf(w, __shfl_xor_sync(0xffffffffu, w, o));
    if (tid == 0) red_v[0] = w;
  }
  __syncthreads();
  m = red_v[0];
  __syncthreads();
  float e = tid < n ? expf(v - m) : 0.f;
  float s = e;
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  if (tid % 32 == 0) red_v[tid / 32] = s;
  __syncthreads();
  if (tid < 32) {
    float w = tid < blockDim.x / 32 ? red_v[tid] : 0.f;
    for (int o = 16; o > 0; o >>= 1) w += __shfl_xor_sync(0xffffffffu, w, o);
    if (tid == 0) red_v[0] = w;
  }
  __syncthreads();
  const float total = red_v[0];
  __syncthreads();
  if (tid < n) p[tid] = e / total;
  __syncthreads();
  // k rounds of arg-max (ties → lower id); the chosen entry is knocked out with -1.
  float chosen_sum = 0.f;
  for (int r = 0; r < k; ++r) {
    float bv = tid < n ? p[tid] : -1.f;
    int bi = tid;
    for (int o = 16; o > 0; o >>= 1) {
      float ov = __shfl_xor_sync(0xffffffffu, bv, o);
      int oi = __shfl_xor_sync(0xffffffffu, bi, o);
      if (ov > bv || (ov == bv && oi < bi)) {
        bv = ov;
        bi = oi;
      }
    }
    if (tid % 32 == 0) {
      red_v[tid / 32] = bv;
      red_i[tid / 32] = bi;
    }
    __syncthreads();
    if (tid == 0) {
      float best = red_v[0];
      int besti = red_i[0];
      for (int w = 1; w < static_cast<int>(blockDim.x / 32); ++w) {
        if (red_v[w] > best || (red_v[w] == best && red_i[w] < besti)) {
          best = red_v[w];
          besti = red_i[w];
        }
      }
      ids[r] = besti;
      weights[r] = best;
      chosen_sum += best;
      p[besti] = -1.f;
    }
    __syncthreads();
  }
  if (tid == 0 && renormalise) {
    for (int r = 0; r < k; ++r) weights[r] /= chosen_sum;
  }
}

// One block of k_topk_threads: p to shared memory (16-byte aligned), then the ranking of the
// decode step's gate/up (split over every thread) or of the router's last block.
constexpr int k_topk_threads = 256;
__global__ void block_topk_kernel(const float* __restrict__ p, int n, int k, int split, int32_t* ids, float* vals) {
  __shared__ __align__(16) float ps[1024];
  __shared__ int pick_id[32];
  __shared__ float pick_v[32];
  __shared__ int cnt[k_topk_threads];
  for (int e = threadIdx.x; e < n; e += k_topk_threads) ps[e] = p[e];
  __syncthreads();
  if (split) {
    detail::block_topk_by_rank_split(ps, n, k, threadIdx.x, k_topk_threads, pick_id, pick_v, cnt, -INFINITY);
  } else {
    detail::block_topk_by_rank(ps, n, k, threadIdx.x, k_topk_threads, pick_id, pick_v, -INFINITY);
  }
  __syncthreads();
  if (static_cast<int>(threadIdx.x) < k) {
    ids[threadIdx.x] = pick_id[threadIdx.x];
    vals[threadIdx.x] = pick_v[threadIdx.x];
  }
}

}  // namespace

void launch_block_topk_by_rank(const float* p, int n, int k, bool split, int32_t* ids, float* vals, cudaStream_t stream) {
  detail::require(n > 0 && n <= 1024 && k > 0 && k <= 32 && k <= n, "launch_block_topk_by_rank",
                  "n must be in (0, 1024] and k in (0, min(n, 32)], got " + std::to_string(n) + " and " + std::to_string(k));
  block_topk_kernel<<<1, k_topk_threads, 0, stream>>>(p, n, k, split ? 1 : 0, ids, vals);
  detail::check_launch();
}

void launch_router_topk(const float* logits, int n_experts, int k, bool renormalise, int32_t* ids, float* weights,
                        cudaStream_t stream) {
  detail::require(n_experts > 0 && n_experts <= 1024, "launch_router_topk",
                  "n_experts must be in (0, 1024], got " + std::to_string(n_experts));
  detail::require(k > 0 && k <= n_experts, "launch_router_topk",
                  "k must be in (0, n_experts=" + std::to_string(n_experts) + "], got " + std::to_string(k));
  const int threads = ((n_experts + 31) / 32) * 32;
  router_topk_kernel<<<1, threads, 0, stream>>>(logits, n_experts, k, renormalise ? 1 : 0, ids, weights);
  detail::check_launch();
}

}  // namespace servedeck::worker::cuda
