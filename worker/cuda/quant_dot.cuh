// The quantised experts' arithmetic shared by their decode kernels (internal to worker/cuda):
// e4m3 and e2m1 to float, the x layout the lanes read without bank conflicts, the 16- and
// 32-weight dot products of one uint4 of a stored row, and where a row and its scales sit in an
// expert block (quant_layout.cuh). Used by quant_moe.cu (the unfolded path's gate/up and the
// down) and fused_moe.cu (gate/up after the folded router).
#pragma once

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstddef>
#include <cstdint>

#include "worker/cuda/kernels.cuh"
#include "worker/cuda/quant_layout.cuh"

namespace servedeck::worker::cuda::detail {

/// Two e4m3 bytes (low byte first) → two floats (exact).
__device__ __forceinline__ float2 e4m3x2(uint16_t v) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(v), __NV_E4M3);
  return __half22float2(*reinterpret_cast<const __half2*>(&h));
}

__device__ __forceinline__ float e4m3(uint8_t v) {
  const __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(v), __NV_E4M3);
  return __half2float(*reinterpret_cast<const __half*>(&h));
}

/// The two e2m1 nibbles of byte b (low first) as floats divided by 2^14 (fp16 bit placement).
__device__ __forceinline__ float2 e2m1x2_scaled(uint32_t b) {
  const uint32_t lo = ((b & 7u) << 9) | ((b & 8u) << 12);
  const uint32_t hi = (((b >> 4) & 7u) << 9) | (((b >> 4) & 8u) << 12);
  const uint32_t pair = lo | (hi << 16);
  return __half22float2(*reinterpret_cast<const __half2*>(&pair));
}

/// Columns per uint4 of a stored row: 16 fp8 weights, 32 e2m1 weights.
template <ExpertFormat F>
constexpr int chunk_cols() { return F == ExpertFormat::fp8_block ? 16 : 32; }

/// Where column `col` of an input vector of `cols` values lives in shared memory: lane l reads
/// the x of the chunks l, l + 32, ... (chunk_cols<F>() consecutive columns each), so x is stored
/// in groups of 4 columns with the chunks' groups q side by side: column c of chunk i at
/// ((c / 4) · n + i) · 4 + c % 4, n = cols / chunk_cols<F>(). Each float4 read of a warp then
/// covers 512 consecutive bytes (no bank conflicts) where a plain layout puts every lane of a
/// quarter-warp on the same banks.
template <ExpertFormat F>
__device__ __forceinline__ int chunked_x_index(int col, int cols) {
  constexpr int per = chunk_cols<F>();
  const int i = col / per, c = col % per;
  return ((c / 4) * (cols / per) + i) * 4 + c % 4;
}

/// Σ over the 16 fp8 weights of one uint4 (columns c0 .. c0+15) of (q · s) · x[c]; xc: the
/// chunk's first group of x (chunked_x_index), gs: floats between its groups.
__device__ __forceinline__ float dot16_fp8(uint4 w, float s, const float* xc, int gs) {
  const uint32_t words[4] = {w.x, w.y, w.z, w.w};
  float acc = 0.f;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float4 x = *reinterpret_cast<const float4*>(xc + i * gs);
    const float2 a = e4m3x2(static_cast<uint16_t>(words[i] & 0xffffu));
    const float2 b = e4m3x2(static_cast<uint16_t>(words[i] >> 16));
    acc += (a.x * s) * x.x + (a.y * s) * x.y + (b.x * s) * x.z + (b.y * s) * x.w;
  }
  return acc;
}

/// Σ over the 32 e2m1 weights of one uint4 (two groups of 16) of (e2m1 · s_g) · x[c]; s0, s1
/// are the groups' scales times 2^14 (see e2m1x2_scaled); xc, gs as dot16_fp8.
__device__ __forceinline__ float dot32_fp4(uint4 w, float s0, float s1, const float* xc, int gs) {
  const uint32_t words[4] = {w.x, w.y, w.z, w.w};
  float acc = 0.f;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float s = i < 2 ? s0 : s1;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float4 x = *reinterpret_cast<const float4*>(xc + (2 * i + h) * gs);
      const float2 v0 = e2m1x2_scaled((words[i] >> (16 * h)) & 0xffu);
      acc += (v0.x * s) * x.x + (v0.y * s) * x.y;
      const float2 v1 = e2m1x2_scaled((words[i] >> (16 * h + 8)) & 0xffu);
      acc += (v1.x * s) * x.z + (v1.y * s) * x.w;
    }
  }
  return acc;
}

/// dot32_fp4 with the chunk's scales as stored: `pair` holds the e4m3 scales of its two groups of
/// 16 (the first in the low byte), `glob` the matrix's weight_scale_2 × 2^14.
__device__ __forceinline__ float dot32_fp4_stored(uint4 w, uint16_t pair, float glob, const float* xc, int gs) {
  return dot32_fp4(w, e4m3(static_cast<uint8_t>(pair & 0xffu)) * glob, e4m3(static_cast<uint8_t>(pair >> 8)) * glob, xc, gs);
}

/// Where row r of matrix m (0 gate, 1 up, 2 down) of a block starts, and its scales.
struct RowRef {
  const uint8_t* w;
  const uint8_t* s;
  float g;  // nvfp4: weight_scale_2 × 2^14
};

template <ExpertFormat F>
__device__ __forceinline__ RowRef row_of(const uint8_t* block, const QuantLayout& L, int m, int r) {
  const int cols = m == 2 ? L.inter : L.hidden;
  const std::size_t wbase = m == 0 ? L.gate_w() : m == 1 ? L.up_w() : L.down_w();
  const std::size_t sbase = m == 0 ? L.gate_s() : m == 1 ? L.up_s() : L.down_s();
  RowRef ref;
  if constexpr (F == ExpertFormat::fp8_block) {
    const std::size_t scols = QuantLayout::cdiv(static_cast<std::size_t>(cols), static_cast<std::size_t>(L.bc));
    ref.w = block + wbase + static_cast<std::size_t>(r) * cols;
    ref.s = block + sbase + 4 * (static_cast<std::size_t>(r / L.br) * scols);
    ref.g = 1.f;
  } else {
    ref.w = block + wbase + static_cast<std::size_t>(r) * (cols / 2);
    ref.s = block + sbase + static_cast<std::size_t>(r) * (cols / 16);
    ref.g = reinterpret_cast<const float*>(block + L.globals())[m] * 16384.f;
  }
  return ref;
}

}  // namespace servedeck::worker::cuda::detail
