// Top-k sampling's selection on the device (launch_top_k_row): the k best finite logits of the
// decode step's row in top_logits' order (sampler.hpp), so a top-k sampled decode copies back
// k (logit, id) pairs instead of the 608 KB row and skips the host's pass over it.
//
// Each logit becomes a 64-bit key that orders as the sampler does: the float's bits mapped so
// unsigned order is numeric order (-0.0 read as +0.0, its equal), in the high word, and
// 0xffffffff − id in the low word (a lower id wins a tie); a NaN or ±inf becomes key 0, which no
// finite logit maps to (the least finite key is −FLT_MAX's, 0x00800000 in the high word). The
// selected logits are read back from the row by id. Pass 1: block b sorts its slice of
// k_top_k_slice keys in shared memory (bitonic, descending) and writes its first k. Pass 2: one
// block sorts the blocks' k · blocks keys the same way and writes the first k, decoded, and how
// many of them are finite. Sorting networks: every key is compared, so the result does not depend
// on scheduling, and ties are impossible (ids differ).
#include <cstdint>
#include <string>

#include "worker/cuda/fused.cuh"
#include "worker/cuda/launch_check.cuh"

namespace servedeck::worker::cuda {

namespace {

constexpr int k_slice_threads = 512;
constexpr int k_merge_threads = 1024;

__device__ __forceinline__ unsigned long long key_of(float v, int i) {
  if (!isfinite(v)) return 0ull;
  // -0.0 and +0.0 are one value to the sampler (a tie, the lower id first): one key.
  const unsigned int b = v == 0.f ? 0u : __float_as_uint(v);
  const unsigned int ordered = (b & 0x80000000u) ? ~b : (b | 0x80000000u);
  return (static_cast<unsigned long long>(ordered) << 32) | (0xffffffffu - static_cast<unsigned int>(i));
}

/// Sorts s[0, n) descending, n a power of two, with the block's threads (bitonic network).
__device__ void bitonic_desc(unsigned long long* s, int n) {
  for (int size = 2; size <= n; size *= 2) {
    for (int stride = size / 2; stride > 0; stride /= 2) {
      __syncthreads();
      for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const int j = i ^ stride;
        if (j > i) {
          const bool desc = (i & size) == 0;
          const unsigned long long a = s[i], b = s[j];
          if (desc ? a < b : a > b) {
            s[i] = b;
            s[j] = a;
          }
        }
      }
    }
  }
  __syncthreads();
}

__global__ void __launch_bounds__(k_slice_threads) top_k_slice_kernel(const float* __restrict__ x, int n, int k,
                                                                     unsigned long long* __restrict__ partial) {
  __shared__ unsigned long long s[k_top_k_slice];
  const int lo = blockIdx.x * k_top_k_slice;
  for (int i = threadIdx.x; i < k_top_k_slice; i += blockDim.x) s[i] = lo + i < n ? key_of(__ldcg(x + lo + i), lo + i) : 0ull;
  bitonic_desc(s, k_top_k_slice);
  for (int i = threadIdx.x; i < k; i += blockDim.x) partial[static_cast<std::size_t>(blockIdx.x) * k + i] = s[i];
}

__global__ void __launch_bounds__(k_merge_threads) top_k_merge_kernel(const float* __restrict__ x, const unsigned long long* __restrict__ partial,
                                                                     int m, int k, TopKOut out) {
  extern __shared__ unsigned long long sm[];
  int n = 1;
  while (n < m) n *= 2;
  for (int i = threadIdx.x; i < n; i += blockDim.x) sm[i] = i < m ? partial[i] : 0ull;
  bitonic_desc(sm, n);
  for (int i = threadIdx.x; i < k; i += blockDim.x) {
    const unsigned long long key = sm[i];
    const int32_t id = key == 0ull ? -1 : static_cast<int32_t>(0xffffffffu - static_cast<unsigned int>(key & 0xffffffffull));
    out.logits[i] = id < 0 ? 0.f : __ldcg(x + id);  // the row's own value: -0.0 stays -0.0
    out.ids[i] = id;
  }
  if (threadIdx.x == 0) {
    int finite = 0;
    while (finite < k && sm[finite] != 0ull) ++finite;
    *out.count = finite;
  }
}

}  // namespace

int top_k_blocks(int n) { return (n + k_top_k_slice - 1) / k_top_k_slice; }

void launch_top_k_row(const float* x, int n, int k, unsigned long long* partial, const TopKOut& out, cudaStream_t stream) {
  detail::require(n > 0 && k >= 1 && k <= k_max_device_top_k, "launch_top_k_row",
                  "expected n > 0 and k in [1, " + std::to_string(k_max_device_top_k) + "], got n " + std::to_string(n) +
                      ", k " + std::to_string(k));
  const int blocks = top_k_blocks(n);
  const int m = blocks * k;
  int padded = 1;
  while (padded < m) padded *= 2;
  const std::size_t smem = static_cast<std::size_t>(padded) * sizeof(unsigned long long);
  detail::require(padded <= 4096, "launch_top_k_row",
                  "the merge of " + std::to_string(m) + " candidates needs " + std::to_string(smem) +
                      " bytes of shared memory, more than 32 KiB (n " + std::to_string(n) + ", k " + std::to_string(k) + ")");
  top_k_slice_kernel<<<blocks, k_slice_threads, 0, stream>>>(x, n, k, partial);
  detail::check_launch();
  top_k_merge_kernel<<<1, k_merge_threads, smem, stream>>>(x, partial, m, k, out);
  detail::check_launch();
}

}  // namespace servedeck::worker::cuda
