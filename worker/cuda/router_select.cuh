// Device helpers for the MoE router (internal to worker/cuda): one warp turns a row of router
// logits held in shared memory into probabilities (the same softmax in the decode step,
// fused_decode.cu, and in prefill, prefill.cu) and picks the top-k: k warp_argmax rounds in
// prefill, block_topk_by_rank (or its split over the block, block_topk_by_rank_split) in decode,
// which picks the same experts in the same order (ties → lower id), so both route identically.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "worker/cuda/dot.cuh"

namespace servedeck::worker::cuda::detail {

/// In place: p[0..n) = softmax(p[0..n)) over one warp (max-subtracted, fp32); ends with a
/// __syncwarp so every lane sees the result.
__device__ __forceinline__ void warp_softmax_inplace(float* p, int n, int lane) {
  float m = -INFINITY;
  for (int e = lane; e < n; e += 32) m = fmaxf(m, p[e]);
  m = warp_max(m);
  float s = 0.f;
  for (int e = lane; e < n; e += 32) {
    p[e] = expf(p[e] - m);
    s += p[e];
  }
  const float total = warp_sum(s);
  for (int e = lane; e < n; e += 32) p[e] = p[e] / total;
  __syncwarp();
}

/// The largest of p[0..n) and its index, in every lane of the warp; ties keep the lower index
/// (a strided scan in increasing index, then a shuffle tree that prefers the lower index).
__device__ __forceinline__ void warp_argmax(const float* p, int n, int lane, float& best, int& best_id) {
  float bv = -1.f;  // probabilities are >= 0; a taken expert is marked -1
  int bi = n;
  for (int e = lane; e < n; e += 32)
    if (p[e] > bv) {
      bv = p[e];
      bi = e;
    }
  for (int off = 16; off > 0; off >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, bv, off);
    const int oi = __shfl_xor_sync(0xffffffffu, bi, off);
    if (ov > bv || (ov == bv && oi < bi)) {
      bv = ov;
      bi = oi;
    }
  }
  best = bv;
  best_id = bi;
}

/// The value a ranking compares for x: x itself, or nan_as when x is NaN (so that the ranks stay
/// a total order).
__device__ __forceinline__ float rank_value(float x, float nan_as) { return x == x ? x : nan_as; }

/// The k largest of p[0..n) over a whole block (thread t of nthreads takes e = t, t + nthreads,
/// ...), in the order and with the ties of k rounds of warp_argmax: e is pick r when
/// r = #{j : p[j] > p[e]} + #{j < e : p[j] == p[e]} < k. Writes ids[r] and vals[r] (shared
/// memory) for r < k; every pick is written by exactly one thread. No barrier inside. A NaN
/// ranks as `nan_as` (default -1: below every probability; pass -INFINITY for raw logits), so the
/// ranks stay a total order and every pick r < k is written even from a poisoned residual stream.
__device__ __forceinline__ void block_topk_by_rank(const float* p, int n, int k, int t, int nthreads, int* ids, float* vals,
                                                   float nan_as = -1.f) {
  auto at = [p, nan_as](int j) { return rank_value(p[j], nan_as); };
  for (int e = t; e < n; e += nthreads) {
    const float v = at(e);
    int rank = 0;
#pragma unroll 8
    for (int j = 0; j < e; ++j) rank += at(j) >= v ? 1 : 0;
#pragma unroll 8
    for (int j = e + 1; j < n; ++j) rank += at(j) > v ? 1 : 0;
    if (rank < k) {
      ids[rank] = e;
      vals[rank] = v;
    }
  }
}

/// block_topk_by_rank's picks (the same ids and vals, bit for bit) by a block of nthreads >= 2n
/// threads, for n % 8 == 0 and p 16-byte aligned: thread t < n ranks e = t against p[0..n/2),
/// thread n + t against p[n/2..n), four values per shared-memory load, and thread t adds the two
/// counts through cnt[2n] (shared). Contains one __syncthreads on every path (every thread of the
/// block must call it): ids and vals are written after it. Any other shape: block_topk_by_rank,
/// then the barrier.
__device__ __forceinline__ void block_topk_by_rank_split(const float* p, int n, int k, int t, int nthreads, int* ids, float* vals,
                                                         int* cnt, float nan_as = -1.f) {
  if (2 * n > nthreads || n % 8 != 0 || reinterpret_cast<uintptr_t>(p) % 16 != 0) {
    block_topk_by_rank(p, n, k, t, nthreads, ids, vals, nan_as);
    __syncthreads();
    return;
  }
  const auto fix = [nan_as](float x) { return rank_value(x, nan_as); };
  const int e = t < n ? t : t - n, j0 = t < n ? 0 : n / 2;
  if (t < 2 * n) {
    const float v = fix(p[e]);
    const float4* p4 = reinterpret_cast<const float4*>(p + j0);
    int c = 0;
#pragma unroll 4
    for (int q = 0; q < n / 8; ++q) {
      const float4 x = p4[q];
      const int j = j0 + 4 * q;
      const float xs[4] = {fix(x.x), fix(x.y), fix(x.z), fix(x.w)};
#pragma unroll
      for (int u = 0; u < 4; ++u) c += (xs[u] > v || (xs[u] == v && j + u < e)) ? 1 : 0;
    }
    cnt[t] = c;
  }
  __syncthreads();
  if (t < n) {
    const int rank = cnt[t] + cnt[t + n];
    if (rank < k) {
      ids[rank] = t;
      vals[rank] = fix(p[t]);
    }
  }
}

/// The routing counters of one pick e (a thread's): counters[0] (hot hits) or counters[1]
/// (misses) by hot_flags[e] (1 = in VRAM), and the layer's routing count layer_counts[e]; atomic.
__device__ __forceinline__ void count_pick(const uint8_t* hot_flags, unsigned long long* counters, unsigned long long* layer_counts,
                                           int e) {
  atomicAdd(&counters[hot_flags[e] ? 0 : 1], 1ull);
  atomicAdd(&layer_counts[e], 1ull);
}

}  // namespace servedeck::worker::cuda::detail
