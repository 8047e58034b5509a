// Device helpers shared by the GEMV-style kernels (internal to worker/cuda): bf16×fp32 dot
// products over 16-byte loads and warp reductions with a fixed shuffle tree (deterministic).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

namespace servedeck::worker::cuda::detail {

/// 8 bf16 weights (one 16-byte load) times 8 fp32 activations.
__device__ __forceinline__ float dot8(uint4 w, float4 a, float4 b) {
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&w);
  const float2 f0 = __bfloat1622float2(h[0]), f1 = __bfloat1622float2(h[1]);
  const float2 f2 = __bfloat1622float2(h[2]), f3 = __bfloat1622float2(h[3]);
  return f0.x * a.x + f0.y * a.y + f1.x * a.z + f1.y * a.w + f2.x * b.x + f2.y * b.y + f3.x * b.z + f3.y * b.w;
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

/// The warp sums of eight values per lane in 9 shuffles instead of 8 · 5 (a reduce-scatter):
/// in halving steps over lane bits 4, 3 and 2 each lane keeps half of its values (the half its
/// bit names) and adds the partner's copy of that half, which the partner sends while keeping the
/// other; lane l then holds a partial of value (l >> 2) & 7, and two butterfly steps over bits 1
/// and 0 finish it. Returns the full sum of v[(lane >> 2) & 7] over the warp, in every lane
/// whose bits 4..2 name that value. A fixed order (the same for every call), not warp_sum's.
__device__ __forceinline__ float warp_sum8_scatter(const float (&v)[8], int lane) {
  const bool b4 = lane & 16, b3 = lane & 8, b2 = lane & 4;
  float w4[4], w2[2];
#pragma unroll
  for (int i = 0; i < 4; ++i) w4[i] = (b4 ? v[i + 4] : v[i]) + __shfl_xor_sync(0xffffffffu, b4 ? v[i] : v[i + 4], 16);
#pragma unroll
  for (int i = 0; i < 2; ++i) w2[i] = (b3 ? w4[i + 2] : w4[i]) + __shfl_xor_sync(0xffffffffu, b3 ? w4[i] : w4[i + 2], 8);
  float s = (b2 ? w2[1] : w2[0]) + __shfl_xor_sync(0xffffffffu, b2 ? w2[0] : w2[1], 4);
  s += __shfl_xor_sync(0xffffffffu, s, 2);
  s += __shfl_xor_sync(0xffffffffu, s, 1);
  return s;
}

/// The warp sums of eight row partials per lane stored to rows[g .. g + 8) (rows past nrows
/// skipped), by one reduce-scatter (warp_sum8_scatter: 9 shuffles instead of 8 shuffle trees).
__device__ __forceinline__ void store_row_sums8(const float (&v)[8], int lane, int g, int nrows, float* rows) {
  const float s = warp_sum8_scatter(v, lane);
  const int r = (lane >> 2) & 7;
  if ((lane & 3) == 0 && g + r < nrows) rows[g + r] = s;
}

__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

/// Adds to `acc` this lane's terms of row·x from 16-byte block i on (i advancing by 32 per lane
/// step; n8 blocks in all): four independent loads in flight, then the tail one at a time.
__device__ __forceinline__ float lane_dot_from(const uint4* w, const float4* x4, int n8, int i, float acc) {
  for (; i + 96 < n8; i += 128) {
    const uint4 w0 = w[i], w1 = w[i + 32], w2 = w[i + 64], w3 = w[i + 96];
    acc += dot8(w0, x4[2 * i], x4[2 * i + 1]);
    acc += dot8(w1, x4[2 * (i + 32)], x4[2 * (i + 32) + 1]);
    acc += dot8(w2, x4[2 * (i + 64)], x4[2 * (i + 64) + 1]);
    acc += dot8(w3, x4[2 * (i + 96)], x4[2 * (i + 96) + 1]);
  }
  for (; i < n8; i += 32) acc += dot8(w[i], x4[2 * i], x4[2 * i + 1]);
  return acc;
}

/// This lane's share of row·x (not yet reduced over the warp); n % 8 == 0, row and x 16-byte
/// aligned. Four independent 16-byte loads in flight per lane.
__device__ __forceinline__ float lane_dot(const __nv_bfloat16* row, const float* x, int n, int lane) {
  return lane_dot_from(reinterpret_cast<const uint4*>(row), reinterpret_cast<const float4*>(x), n / 8, lane, 0.f);
}

/// norm_rope_head's constants for one lane at position pos, loaded and computed early (before
/// waiting for the previous kernel: the weights and frequencies are never written, the position
/// is the host's): its norm weights (elements lane + 32 i, i < 8) and the cosine and sine of
/// pos · inv_freq[lane + 32 m] (m < 4; rotary / 2 <= 128), so no sincosf is left after the wait.
struct RopeHeadPrefetch {
  float nw[8];
  float cs[4], sn[4];
};

__device__ __forceinline__ RopeHeadPrefetch prefetch_rope_head(const __nv_bfloat16* nw, const float* inv_freq, int hd, int rotary,
                                                               int pos, int lane) {
  RopeHeadPrefetch p;
#pragma unroll
  for (int i = 0; i < 8; ++i) p.nw[i] = nw != nullptr && lane + 32 * i < hd ? __bfloat162float(nw[lane + 32 * i]) : 0.f;
#pragma unroll
  for (int m = 0; m < 4; ++m) {
    const float f = lane + 32 * m < rotary / 2 ? inv_freq[lane + 32 * m] : 0.f;
    sincosf(static_cast<float>(pos) * f, &p.sn[m], &p.cs[m]);
  }
  return p;
}

/// One lane's elements lane + 32 i (i < 8) of a head of hd <= 256 floats, zero past hd: loaded
/// into registers, so a caller can issue them before other memory traffic and use them later.
struct HeadValues {
  float v[8];
};

__device__ __forceinline__ HeadValues load_head(const float* src, int hd, int lane) {
  HeadValues h;
#pragma unroll
  for (int i = 0; i < 8; ++i) h.v[i] = lane + 32 * i < hd ? src[lane + 32 * i] : 0.f;
  return h;
}

/// One warp: optional per-head RMSNorm (`norm`) of the head's values (load_head), then RoPE
/// (rotate_half), into dst, with the constants of prefetch_rope_head (which fixed the position).
/// hd <= 256, rotary <= hd.
__device__ __forceinline__ void norm_rope_head_loaded(HeadValues h, const RopeHeadPrefetch& p, bool norm, float* dst, int hd, int rotary,
                                                      float eps, int lane) {
  float* v = h.v;
  float ss = 0.f;
#pragma unroll
  for (int i = 0; i < 8; ++i) ss += v[i] * v[i];
  if (norm) {
    const float inv = rsqrtf(warp_sum(ss) / hd + eps);
#pragma unroll
    for (int i = 0; i < 8; ++i)
      if (lane + 32 * i < hd) v[i] = v[i] * inv * p.nw[i];
  }
#pragma unroll
  for (int i = 0; i < 8; ++i)
    if (lane + 32 * i < hd) dst[lane + 32 * i] = v[i];
  __syncwarp();
  const int half = rotary / 2;
#pragma unroll
  for (int m = 0; m < 4; ++m) {
    const int i = lane + 32 * m;
    if (i < half) {
      const float x1 = dst[i], x2 = dst[i + half];
      dst[i] = x1 * p.cs[m] - x2 * p.sn[m];
      dst[i + half] = x2 * p.cs[m] + x1 * p.sn[m];
    }
  }
  __syncwarp();
}

/// norm_rope_head_loaded of src's head (dst may be src).
__device__ __forceinline__ void norm_rope_head_prefetched(const float* src, const RopeHeadPrefetch& p, bool norm, float* dst, int hd,
                                                          int rotary, float eps, int lane) {
  norm_rope_head_loaded(load_head(src, hd, lane), p, norm, dst, hd, rotary, eps, lane);
}

/// One warp: optional per-head RMSNorm (nw null: none), then RoPE (rotate_half) at position pos,
/// into dst (may be src). inv_freq: (rotary / 2) table computed on the host at load
/// (rope_inv_freq in fused.cuh). hd <= 256.
__device__ __forceinline__ void norm_rope_head(const float* src, const __nv_bfloat16* nw, float* dst, int hd, int rotary,
                                               float eps, const float* inv_freq, int pos, int lane) {
  norm_rope_head_prefetched(src, prefetch_rope_head(nw, inv_freq, hd, rotary, pos, lane), nw != nullptr, dst, hd, rotary, eps, lane);
}

/// The first eight 16-byte weight loads of a lane's share of a row (elements lane*8 + 256*u,
/// u < 8), issued early, e.g. before waiting for the previous kernel: weights are never written
/// by it. Zero where the row is shorter.
struct RowPrefetch {
  uint4 w[8];
};

__device__ __forceinline__ RowPrefetch prefetch_row(const __nv_bfloat16* row, int n, int lane) {
  RowPrefetch p;
  const uint4* w = reinterpret_cast<const uint4*>(row);
  const int n8 = n / 8;
#pragma unroll
  for (int u = 0; u < 8; ++u) p.w[u] = lane + 32 * u < n8 ? w[lane + 32 * u] : make_uint4(0, 0, 0, 0);
  return p;
}

/// lane_dot whose first eight steps use `p` (prefetch_row of the same row). Terms are added in
/// the same order as lane_dot, so the result is bit-identical to it.
__device__ __forceinline__ float lane_dot_prefetched(const RowPrefetch& p, const __nv_bfloat16* row, const float* x, int n,
                                                     int lane) {
  const uint4* w = reinterpret_cast<const uint4*>(row);
  const float4* x4 = reinterpret_cast<const float4*>(x);
  const int n8 = n / 8;
  float acc = 0.f;
#pragma unroll
  for (int u = 0; u < 8; ++u) {
    const int i = lane + 32 * u;
    if (i < n8) acc += dot8(p.w[u], x4[2 * i], x4[2 * i + 1]);
  }
  return lane_dot_from(w, x4, n8, lane + 256, acc);
}

/// Every thread of a block of `nthreads` copies its 16-byte pieces t, t + nthreads, ... of
/// `bytes` (a multiple of 16, both addresses 16-byte aligned) from global src to shared dst with
/// cp.async (L1 bypassed), as one commit group; stage_wait_all then waits for them. cp.async
/// runs on sm_80 and later; no bulk copy or mbarrier (one thread's bulk copies measured the same
/// in the decode step, docs/performance.md, 2026-11-29).
__device__ __forceinline__ void stage_async(void* dst, const void* src, unsigned bytes, int t, int nthreads) {
  const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  const char* s = static_cast<const char*>(src);
  for (unsigned off = static_cast<unsigned>(t) * 16u; off < bytes; off += static_cast<unsigned>(nthreads) * 16u)
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(d + off), "l"(s + off) : "memory");
  asm volatile("cp.async.commit_group;" ::: "memory");
}

/// As stage_async, in `pieces` consecutive commit groups of (about) equal size with at most two
/// in flight per thread: each piece is issued once the one before the previous has landed. A
/// staged kernel's 100-200 KB per SM issued at once sits in the SM's memory queue ahead of the
/// loads of the latency-bound kernel running beside it (the attention beside the o-proj); two
/// pieces in flight keep that queue short. pieces <= 1 is stage_async.
__device__ __forceinline__ void stage_async_paced(void* dst, const void* src, unsigned bytes, int t, int nthreads, int pieces) {
  if (pieces <= 1) return stage_async(dst, src, bytes, t, nthreads);
  const unsigned step = static_cast<unsigned>(nthreads) * 16u;  // bytes one round of the block's threads copies
  const unsigned rounds = (bytes + step - 1) / step, per = (rounds + static_cast<unsigned>(pieces) - 1) / static_cast<unsigned>(pieces);
  for (unsigned r0 = 0; r0 < rounds; r0 += per) {
    const unsigned off = r0 * step, n = min(bytes - off, per * step);
    stage_async(static_cast<char*>(dst) + off, static_cast<const char*>(src) + off, n, t, nthreads);
    if (r0 > 0) asm volatile("cp.async.wait_group 1;" ::: "memory");
  }
}

/// Waits for this thread's stage_async copies; a __syncthreads after it makes every thread's
/// copies visible to the block.
__device__ __forceinline__ void stage_wait_all() { asm volatile("cp.async.wait_all;" ::: "memory"); }

}  // namespace servedeck::worker::cuda::detail
