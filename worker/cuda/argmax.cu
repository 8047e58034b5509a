// The decode step's greedy pick on the device (launch_argmax_row): the index of the largest
// logit, so that a greedy decode copies one int32 back per token instead of the logits row
// (608 KB at vocab 151936) and skips the host's scan of it.
#include <climits>
#include <cmath>
#include <string>

#include "worker/cuda/fused.cuh"
#include "worker/cuda/fused_launch.cuh"
#include "worker/cuda/launch_check.cuh"

namespace servedeck::worker::cuda {

namespace {

constexpr int k_argmax_threads = 256;

// (v, i) beats (best, at): larger, or equal and at a lower index. NaN compares false both ways,
// so it never beats anything and nothing NaN is ever held.
__device__ __forceinline__ void take(float v, int i, float& best, int& at) {
  if (v > best || (v == best && i < at)) {
    best = v;
    at = i;
  }
}

// Block b scans its slice [b·per, (b+1)·per) (float4 loads where aligned), reduces the block's
// (value, index) by the shuffle tree and through shared memory, and publishes it; the last block
// to finish reduces the published pairs and writes the pick. `take` is commutative and
// associative over NaN-free pairs, so the pick does not depend on the order of reduction. The
// counter is an intra-grid arrival counter (handshakes.cuh): the last block resets it. With
// step_epoch (the decode step's last kernel) that block also advances the step's epoch: every
// other kernel of the step has completed by then (this grid passed its PDL wait).
__global__ void __launch_bounds__(k_argmax_threads) argmax_kernel(const float* __restrict__ x, int n, int per, ArgmaxScratch s,
                                                                 int32_t* __restrict__ out, unsigned int* step_epoch) {
  __shared__ float bv[k_argmax_threads / 32];
  __shared__ int bi[k_argmax_threads / 32];
  __shared__ int is_last;
  detail::wait_for_predecessor();
  const int lo = blockIdx.x * per, hi = min(n, lo + per);
  float best = -INFINITY;
  int at = INT_MAX;
  // per is a multiple of 4, so lo is 16-byte aligned when x is.
  for (int i = lo + 4 * static_cast<int>(threadIdx.x); i < hi; i += 4 * k_argmax_threads) {
    if (i + 4 <= hi) {
      const float4 v = __ldcg(reinterpret_cast<const float4*>(x + i));
      take(v.x, i, best, at);
      take(v.y, i + 1, best, at);
      take(v.z, i + 2, best, at);
      take(v.w, i + 3, best, at);
    } else {
      for (int j = i; j < hi; ++j) take(__ldcg(x + j), j, best, at);
    }
  }
  for (int off = 16; off > 0; off /= 2) {
    const float ov = __shfl_down_sync(0xffffffffu, best, off);
    const int oi = __shfl_down_sync(0xffffffffu, at, off);
    take(ov, oi, best, at);
  }
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) {
    bv[warp] = best;
    bi[warp] = at;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < k_argmax_threads / 32; ++w) take(bv[w], bi[w], best, at);
    s.values[blockIdx.x] = best;
    s.indices[blockIdx.x] = at;
    __threadfence();
    is_last = atomicAdd(s.counter, 1u) == gridDim.x - 1;
  }
  __syncthreads();
  if (!is_last || threadIdx.x != 0) return;
  __threadfence();
  best = -INFINITY;
  at = INT_MAX;
  for (unsigned b = 0; b < gridDim.x; ++b) take(__ldcg(s.values + b), __ldcg(s.indices + b), best, at);
  // No non-NaN logit, or a NaN at index 0 (worker::argmax's rule: nothing compares larger): 0.
  *out = at == INT_MAX || isnan(__ldcg(x)) ? 0 : at;
  *s.counter = 0u;  // ready for the next launch
  if (step_epoch != nullptr) atomicAdd(step_epoch, 1u);
}

}  // namespace

void launch_argmax_row(const float* x, int n, const ArgmaxScratch& s, int32_t* out, cudaStream_t stream, bool pdl,
                       unsigned int* step_epoch) {
  detail::require(n > 0, "launch_argmax_row", "n must be positive, got " + std::to_string(n));
  detail::require(detail::aligned16(x), "launch_argmax_row", "x must be 16-byte aligned");
  detail::require(s.values != nullptr && s.indices != nullptr && s.counter != nullptr && out != nullptr, "launch_argmax_row",
                  "scratch and out must be set");
  // Slices of a multiple of 4 floats, at most k_argmax_blocks of them.
  int per = (n + k_argmax_blocks - 1) / k_argmax_blocks;
  per = (per + 3) / 4 * 4;
  const int grid = (n + per - 1) / per;
  detail::launch(argmax_kernel, grid, k_argmax_threads, 0, stream, pdl, x, n, per, s, out, step_epoch);
}

}  // namespace servedeck::worker::cuda
