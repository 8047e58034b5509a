// Device helpers of the flash prefill attention kernels (flash_attention.cu; internal to
// worker/cuda): cp.async staging, ldmatrix and mma.sync m16n8k16 wrappers (PTX ISA, "cp.async",
// "ldmatrix", "Matrix fragments for mma.m16n8k16 with floating point type") and the online-softmax
// step of one warp's m16 tile (Milakov & Gimelshein 2018, in the log2 domain as FlashAttention-2,
// Dao 2023). Included by flash_attention.cu only.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

namespace servedeck::worker::cuda::flash {

using bf16 = __nv_bfloat16;

/// 16 bytes from global src to shared dst, asynchronously; valid false zero-fills dst.
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
  const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  const int n = valid ? 16 : 0;  // 0: the 16 bytes are zero-filled
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(d), "l"(src), "r"(n) : "memory");
}
/// cp_async16 with an L2 cache policy (createpolicy): for rows read once, which go evict-first and
/// leave L2 to what is read again (the decode attention's K/V rows; its splits' partials and the
/// weights stay).
__device__ __forceinline__ void cp_async16_evict_first(void* dst, const void* src, bool valid, uint64_t policy) {
  const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  const int n = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;" ::"r"(d), "l"(src), "r"(n),
               "l"(policy)
               : "memory");
}
/// Closes the group of this thread's cp.async copies issued since the last commit.
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
/// Waits until at most N of this thread's committed cp.async groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }

/// Four 8×8 bf16 matrices; lane l gives the address of row l % 8 of matrix l / 8.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const bf16* row) {
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}
/// As ldmatrix_x4, from a shared-state-space address (__cvta_generic_to_shared).
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], unsigned a) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}
/// Two 8×8 bf16 matrices from a shared-state-space address; lane l < 16 gives the address of row
/// l % 8 of matrix l / 8 (lanes 16..31: their addresses are ignored).
__device__ __forceinline__ void ldmatrix_x2(uint32_t (&r)[2], unsigned a) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];" : "=r"(r[0]), "=r"(r[1]) : "r"(a));
}
/// As ldmatrix_x4, each matrix transposed.
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const bf16* row) {
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}

/// Two floats rounded to bf16 (round to nearest even) in one 32-bit register, lo_half in the low 16 bits.
__device__ __forceinline__ uint32_t pack(float lo_half, float hi_half) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo_half, hi_half);  // .x = lo_half (low 16 bits)
  return *reinterpret_cast<const uint32_t*>(&v);
}

/// d += a · b, m16n8k16, bf16 inputs, fp32 accumulators.
__device__ __forceinline__ void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/// One warp's running softmax state for the rows g and g + 8 of an m16 tile (this lane's), in
/// the log2 domain: max m, sum l of the bf16-rounded weights, and the rows' query positions.
struct SoftmaxRows {
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;
  int qpos0 = 0, qpos1 = 0;

  /// Folds the 16 × (8·NJ) score tile s (Q·Kᵀ, unscaled; keys kb0 ..) into the state: masks
  /// keys past a row's position when `masked`, scales by scale_log2, sets p to the bf16 A
  /// fragments of P = 2^(S − m_new) and c0, c1 to 2^(m_old − m_new) (the factor O must be
  /// rescaled by).
  template <int NJ>
  __device__ __forceinline__ void tile(float (&s)[NJ][4], int kb0, bool masked, int t4, float scale_log2, uint32_t (&p)[NJ / 2][4],
                                       float& c0, float& c1) {
    // Online softmax in the log2 domain. This thread holds columns j·8 + 2·t4 + {0, 1} of rows g
    // (s[j][0..1]) and g + 8 (s[j][2..3]); the four lanes of a row complete it (shuffles xor 1, 2).
#pragma unroll
    for (int j = 0; j < NJ; ++j)
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int key = kb0 + j * 8 + t4 * 2 + c;
        s[j][c] = masked && key > qpos0 ? -INFINITY : s[j][c] * scale_log2;
        s[j][2 + c] = masked && key > qpos1 ? -INFINITY : s[j][2 + c] * scale_log2;
      }
    float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
    for (int j = 0; j < NJ; ++j) {
      mx0 = fmaxf(mx0, fmaxf(s[j][0], s[j][1]));
      mx1 = fmaxf(mx1, fmaxf(s[j][2], s[j][3]));
    }
#pragma unroll
    for (int x = 1; x <= 2; x <<= 1) {
      mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, x));
      mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, x));
    }
    const float mn0 = fmaxf(m0, mx0), mn1 = fmaxf(m1, mx1);  // finite: key 0 is in every row's first tile
    c0 = exp2f(m0 - mn0);
    c1 = exp2f(m1 - mn1);
    m0 = mn0;
    m1 = mn1;
    float sum0 = 0.f, sum1 = 0.f;
#pragma unroll
    for (int j = 0; j < NJ; ++j) {
      // Masked scores are −inf: 2^(−inf) = 0. The sums add the bf16-rounded values, so each row's
      // weights sum to exactly what multiplies v.
      const __nv_bfloat162 r0 = __floats2bfloat162_rn(exp2f(s[j][0] - mn0), exp2f(s[j][1] - mn0));
      const __nv_bfloat162 r1 = __floats2bfloat162_rn(exp2f(s[j][2] - mn1), exp2f(s[j][3] - mn1));
      sum0 += __low2float(r0) + __high2float(r0);
      sum1 += __low2float(r1) + __high2float(r1);
      p[j / 2][(j % 2) * 2 + 0] = *reinterpret_cast<const uint32_t*>(&r0);  // row g
      p[j / 2][(j % 2) * 2 + 1] = *reinterpret_cast<const uint32_t*>(&r1);  // row g + 8
    }
#pragma unroll
    for (int x = 1; x <= 2; x <<= 1) {
      sum0 += __shfl_xor_sync(0xffffffffu, sum0, x);
      sum1 += __shfl_xor_sync(0xffffffffu, sum1, x);
    }
    l0 = l0 * c0 + sum0;
    l1 = l1 * c1 + sum1;
  }
};

/// O's rows g and g + 8 (this thread's accumulators of NF column groups of 8) times the online
/// softmax's rescale factors c0 and c1 (SoftmaxRows::tile), before O += P·V.
template <int NF>
__device__ __forceinline__ void rescale_rows(float (&o)[NF][4], float c0, float c1) {
#pragma unroll
  for (int f = 0; f < NF; ++f) {
    o[f][0] *= c0;
    o[f][1] *= c0;
    o[f][2] *= c1;
    o[f][3] *= c1;
  }
}

/// out = O / l for this thread's rows g and g + 8 of the 16 query rows starting at row0 (rows at
/// or past n are skipped): columns col0 + f·8 + 2·t4 + {0, 1} of the fp32 output (row stride ldo),
/// NF column groups of 8; l0 and l1 are the rows' softmax sums.
template <int NF>
__device__ __forceinline__ void store_rows(float* __restrict__ out, int ldo, const float (&o)[NF][4], float l0, float l1, int row0, int n,
                                           size_t col0, int g, int t4) {
  const float inv0 = 1.f / l0, inv1 = 1.f / l1;
#pragma unroll
  for (int f = 0; f < NF; ++f) {
    const size_t col = col0 + f * 8 + t4 * 2;
    if (row0 + g < n)
      *reinterpret_cast<float2*>(out + static_cast<size_t>(row0 + g) * ldo + col) = make_float2(o[f][0] * inv0, o[f][1] * inv0);
    if (row0 + g + 8 < n)
      *reinterpret_cast<float2*>(out + static_cast<size_t>(row0 + g + 8) * ldo + col) = make_float2(o[f][2] * inv1, o[f][3] * inv1);
  }
}

}  // namespace servedeck::worker::cuda::flash
