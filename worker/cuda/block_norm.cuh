// Block-wide RMSNorm of one fp32 row into shared memory for the fused decode kernels (internal
// to worker/cuda): xs = x / rms(x) * nw, the sum of squares in a fixed order (each thread its
// float4s in index order, the warp's shuffle tree, then the warps in order), so every block of
// a kernel computes the same xs bit for bit.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "worker/cuda/dot.cuh"

namespace servedeck::worker::cuda::detail {

/// The block's 1 / rms from each thread's partial sum of squares: the warp's shuffle tree, then
/// the warps in order through red[WARPS]. Contains a __syncthreads.
template <int WARPS>
__device__ __forceinline__ float block_inv_rms(float ss, float eps, int in, float* red) {
  ss = warp_sum(ss);
  if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = ss;
  __syncthreads();
  float tot = 0.f;
#pragma unroll
  for (int w = 0; w < WARPS; ++w) tot += red[w];
  return rsqrtf(tot / in + eps);
}

/// The norm weights of a thread's V float4 columns (4 bf16 each: columns 4 (t + v NT) ..+3),
/// loaded early, e.g. before waiting for the previous kernel (weights are never written by it).
template <int V>
struct NormWeights {
  uint2 w[V];
};

/// Loads thread t's NormWeights for a row of `in` floats (in % 4 == 0); zero past the row and
/// for threads t >= NT (a block larger than the norm's NT threads).
template <int NT, int V>
__device__ __forceinline__ NormWeights<V> prefetch_norm_weights(const __nv_bfloat16* nw, int in) {
  NormWeights<V> p;
  const bool active = threadIdx.x < NT;
#pragma unroll
  for (int v = 0; v < V; ++v) {
    const int i = (static_cast<int>(threadIdx.x) + v * NT) * 4;
    p.w[v] = active && i < in ? *reinterpret_cast<const uint2*>(nw + i) : make_uint2(0, 0);
  }
  return p;
}

/// Thread t's V float4 of a row x (columns 4 (t + v NT) ..+3), zero past the row and for threads
/// t >= NT: the loads of block_rmsnorm_prefetched, apart so that a kernel can issue them ahead of
/// bulk copies that would otherwise sit in the SM's memory queue before them (q|k|v's x first).
template <int V>
struct RowRegs {
  float4 v[V];
};

template <int NT, int V>
__device__ __forceinline__ RowRegs<V> load_row_regs(const float* __restrict__ x, int in) {
  RowRegs<V> r;
  const bool active = threadIdx.x < NT;
#pragma unroll
  for (int v = 0; v < V; ++v) {
    const int i = (static_cast<int>(threadIdx.x) + v * NT) * 4;
    // Through L2 (ld.cg), not the read-only path: x was written earlier in the step.
    r.v[v] = active && i < in ? __ldcg(reinterpret_cast<const float4*>(x + i)) : make_float4(0.f, 0.f, 0.f, 0.f);
  }
  return r;
}

/// Where block_rmsnorm_* put columns c .. c + 3 (c a multiple of 4) of the normed row: at c.
struct PlainColumns {
  __device__ int operator()(int c) const { return c; }
};

/// xs[0..in) = x / rms(x) * nw from x's loaded registers (load_row_regs<NT, V>): the block
/// reduction through red[NT / 32], then the products from registers. Returns 1 / rms(x). Ends
/// with __syncthreads. See block_rmsnorm_prefetched. `place` maps the first of four columns to
/// its offset in xs (the four stay adjacent): the plain order, or a kernel's own (the quantised
/// gate/up's chunked_x_index).
template <int NT, int V, typename Place = PlainColumns>
__device__ __forceinline__ float block_rmsnorm_from_regs(const RowRegs<V>& xv, const NormWeights<V>& nw, float eps, int in,
                                                        float* xs, float* red, Place place = {}) {
  const bool active = threadIdx.x < NT;
  float ss = 0.f;
#pragma unroll
  for (int v = 0; v < V; ++v) ss += xv.v[v].x * xv.v[v].x + xv.v[v].y * xv.v[v].y + xv.v[v].z * xv.v[v].z + xv.v[v].w * xv.v[v].w;
  const float inv = block_inv_rms<NT / 32>(ss, eps, in, red);
#pragma unroll
  for (int v = 0; v < V; ++v) {
    const int i = (static_cast<int>(threadIdx.x) + v * NT) * 4;
    if (active && i < in) {
      const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&nw.w[v]);
      const float2 a = __bfloat1622float2(h[0]), b = __bfloat1622float2(h[1]);
      float* o = xs + place(i);
      o[0] = xv.v[v].x * inv * a.x;
      o[1] = xv.v[v].y * inv * a.y;
      o[2] = xv.v[v].z * inv * b.x;
      o[3] = xv.v[v].w * inv * b.y;
    }
  }
  __syncthreads();
  return inv;
}

/// xs[0..in) = x / rms(x) * nw for a block of NT threads with NT * V * 4 >= in, in % 4 == 0,
/// x 16-byte aligned: one round of loads of x (V float4 per thread, held in registers), the
/// block reduction through red[NT / 32], then the products from registers. Bit-identical to
/// block_rmsnorm_to_shared<NT / 32> (the same thread count; another count sums the squares in
/// another order). Returns 1 / rms(x). Ends with __syncthreads. A block of more than NT threads
/// may call it (all of them: it synchronises the block; red then holds one float per warp of the
/// block): threads from NT on take no part in the sums, so the result is the NT-thread one.
template <int NT, int V, typename Place = PlainColumns>
__device__ __forceinline__ float block_rmsnorm_prefetched(const float* __restrict__ x, const NormWeights<V>& nw, float eps,
                                                         int in, float* xs, float* red, Place place = {}) {
  return block_rmsnorm_from_regs<NT, V>(load_row_regs<NT, V>(x, in), nw, eps, in, xs, red, place);
}

/// The same for any `in` (in % 4 == 0): strided loops over x, reading x twice and nw after the
/// reduction. Ends with __syncthreads.
template <int WARPS>
__device__ __forceinline__ void block_rmsnorm_to_shared(const float* __restrict__ x, const __nv_bfloat16* __restrict__ nw, float eps,
                                                        int in, float* xs, float* red) {
  float ss = 0.f;
  for (int i = threadIdx.x * 4; i < in; i += WARPS * 32 * 4) {
    const float4 v = *reinterpret_cast<const float4*>(x + i);
    ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
  }
  const float inv = block_inv_rms<WARPS>(ss, eps, in, red);
  for (int i = threadIdx.x; i < in; i += WARPS * 32) xs[i] = x[i] * inv * __bfloat162float(nw[i]);
  __syncthreads();
}

}  // namespace servedeck::worker::cuda::detail
