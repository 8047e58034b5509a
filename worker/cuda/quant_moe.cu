// Quantised routed experts: decode gate/up + SwiGLU, decode down + weighted reduction, and the
// prefill's dequantisation into bf16 (quant_moe.cuh).
#include "worker/cuda/quant_moe.cuh"

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <string>
#include <type_traits>

#include "worker/cuda/dot.cuh"
#include "worker/cuda/launch_check.cuh"
#include "worker/cuda/quant_layout.cuh"

namespace servedeck::worker::cuda {

namespace {

constexpr int k_warps = 8;

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

/// This lane's share of row · x for R stored rows of `cols` inputs each (R = 2: gate and up,
/// their loads issued together): uint4 chunks lane, lane + 32, ..., two per row in flight. Each
/// row's sum runs over its chunks in increasing order. w_row: the rows' bytes; scales: fp8 the
/// row's block-row of scale_inv floats (one per bc columns), nvfp4 the row's e4m3 scales (one
/// per 16); g: nvfp4 weight_scale_2 × 2^14; x: the input in chunked_x_index order.
template <ExpertFormat F, int R>
__device__ __forceinline__ void lane_rows_dot(const uint8_t* const (&w_row)[R], const uint8_t* const (&scales)[R], const float (&g)[R],
                                              int cols, int bc, const float* x, int lane, float (&acc)[R]) {
  constexpr int per = chunk_cols<F>();
  const int n = cols / per, gs = 4 * n;
  // A chunk's scale: fp8 its block's scale_inv float; nvfp4 the 16-bit pair of e4m3 scales of its
  // two groups, one 2-byte load per lane (a warp's loads cover 64 contiguous bytes: one request
  // where two byte loads were two over host memory), issued with the chunk's weights.
  using Scale = std::conditional_t<F == ExpertFormat::fp8_block, float, uint16_t>;
  auto scale_of = [&](int r, int i) -> Scale {
    if constexpr (F == ExpertFormat::fp8_block) return reinterpret_cast<const float*>(scales[r])[(16 * i) / bc];
    else return reinterpret_cast<const uint16_t*>(scales[r])[i];
  };
  auto dot = [&](int r, uint4 v, Scale sc, int i) {
    if constexpr (F == ExpertFormat::fp8_block)
      return dot16_fp8(v, sc, x + 4 * i, gs);
    else
      return dot32_fp4(v, e4m3(static_cast<uint8_t>(sc & 0xffu)) * g[r], e4m3(static_cast<uint8_t>(sc >> 8)) * g[r], x + 4 * i, gs);
  };
#pragma unroll
  for (int r = 0; r < R; ++r) acc[r] = 0.f;
  int i = lane;
  for (; i + 32 < n; i += 64) {
    uint4 a[R], b[R];
    Scale sa[R], sb[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      a[r] = reinterpret_cast<const uint4*>(w_row[r])[i];
      b[r] = reinterpret_cast<const uint4*>(w_row[r])[i + 32];
      sa[r] = scale_of(r, i);
      sb[r] = scale_of(r, i + 32);
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
      acc[r] += dot(r, a[r], sa[r], i);
      acc[r] += dot(r, b[r], sb[r], i + 32);
    }
  }
  if (i < n) {
    uint4 a[R];
    Scale sa[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      a[r] = reinterpret_cast<const uint4*>(w_row[r])[i];
      sa[r] = scale_of(r, i);
    }
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r] += dot(r, a[r], sa[r], i);
  }
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

template <ExpertFormat F>
__global__ void __launch_bounds__(k_warps * 32) gate_up_quant_kernel(ExpertTable t, const float* __restrict__ xn,
                                                                     const int32_t* __restrict__ ids, int k,
                                                                     float* __restrict__ act) {
  extern __shared__ float xs[];
  __shared__ const uint8_t* blocks[32];
  const QuantLayout L = layout_of(t);
  for (int i = threadIdx.x; i < t.hidden; i += blockDim.x) xs[chunked_x_index<F>(i, t.hidden)] = xn[i];
  if (threadIdx.x < k) blocks[threadIdx.x] = reinterpret_cast<const uint8_t*>(t.experts[ids[threadIdx.x]]);
  __syncthreads();
  const int lane = threadIdx.x % 32, total = k * t.inter;
  for (int gw = blockIdx.x * k_warps + threadIdx.x / 32; gw < total; gw += gridDim.x * k_warps) {
    const int j = gw / t.inter, r = gw % t.inter;
    const RowRef g = row_of<F>(blocks[j], L, 0, r), u = row_of<F>(blocks[j], L, 1, r);
    const uint8_t* const rows[2] = {g.w, u.w};
    const uint8_t* const scales[2] = {g.s, u.s};
    const float globals[2] = {g.g, u.g};
    float part[2];
    lane_rows_dot<F, 2>(rows, scales, globals, t.hidden, t.block_cols, xs, lane, part);
    const float gs = detail::warp_sum(part[0]);
    const float us = detail::warp_sum(part[1]);
    if (lane == 0) act[gw] = gs / (1.f + expf(-gs)) * us;
  }
}

template <ExpertFormat F>
__global__ void __launch_bounds__(k_warps * 32) down_quant_kernel(ExpertTable t, const float* __restrict__ act,
                                                                  const int32_t* __restrict__ ids,
                                                                  const float* __restrict__ weights, int k,
                                                                  float* __restrict__ out) {
  extern __shared__ float as[];
  __shared__ const uint8_t* blocks[32];
  __shared__ float w[32];
  const QuantLayout L = layout_of(t);
  for (int i = threadIdx.x; i < k * t.inter; i += blockDim.x) as[(i / t.inter) * t.inter + chunked_x_index<F>(i % t.inter, t.inter)] = act[i];
  if (threadIdx.x < k) {
    blocks[threadIdx.x] = reinterpret_cast<const uint8_t*>(t.experts[ids[threadIdx.x]]);
    w[threadIdx.x] = weights[threadIdx.x];
  }
  __syncthreads();
  const int lane = threadIdx.x % 32;
  for (int h = blockIdx.x * k_warps + threadIdx.x / 32; h < t.hidden; h += gridDim.x * k_warps) {
    // Four experts' rows at a time (their loads in flight together), summed in order j = 0..k-1.
    float acc = 0.f;
    for (int j0 = 0; j0 < k; j0 += 4) {
      float p[4];
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        p[q] = 0.f;
        if (j0 + q < k) {
          const RowRef d = row_of<F>(blocks[j0 + q], L, 2, h);
          const uint8_t* const rows[1] = {d.w};
          const uint8_t* const scales[1] = {d.s};
          const float globals[1] = {d.g};
          float part[1];
          lane_rows_dot<F, 1>(rows, scales, globals, t.inter, t.block_cols, as + static_cast<std::size_t>(j0 + q) * t.inter, lane, part);
          p[q] = part[0];
        }
      }
#pragma unroll
      for (int q = 0; q < 4; ++q)
        if (j0 + q < k) acc += w[j0 + q] * detail::warp_sum(p[q]);
    }
    if (lane == 0) out[h] += acc;
  }
}

/// One thread per 16 (fp8) or 32 (nvfp4) weights of the block, written as bf16 [gate; up; down].
template <ExpertFormat F>
__global__ void dequantize_kernel(QuantLayout L, const uint8_t* __restrict__ block, __nv_bfloat16* __restrict__ out) {
  constexpr int per = F == ExpertFormat::fp8_block ? 16 : 32;
  const std::size_t ih = L.ih(), chunks_per_matrix = ih / per;
  for (std::size_t c = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; c < 3 * chunks_per_matrix;
       c += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const int m = static_cast<int>(c / chunks_per_matrix);
    const std::size_t e0 = (c % chunks_per_matrix) * per;  // first element in the matrix
    const int cols = m == 2 ? L.inter : L.hidden;
    const int r = static_cast<int>(e0 / cols), col = static_cast<int>(e0 % cols);
    const RowRef ref = row_of<F>(block, L, m, r);
    __nv_bfloat16* o = out + static_cast<std::size_t>(m) * ih + e0;
    if constexpr (F == ExpertFormat::fp8_block) {
      const uint4 v = *reinterpret_cast<const uint4*>(ref.w + col);
      const float s = reinterpret_cast<const float*>(ref.s)[col / L.bc];
      const uint32_t words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float2 a = e4m3x2(static_cast<uint16_t>(words[i] & 0xffffu));
        const float2 b = e4m3x2(static_cast<uint16_t>(words[i] >> 16));
        o[4 * i] = __float2bfloat16_rn(a.x * s);
        o[4 * i + 1] = __float2bfloat16_rn(a.y * s);
        o[4 * i + 2] = __float2bfloat16_rn(b.x * s);
        o[4 * i + 3] = __float2bfloat16_rn(b.y * s);
      }
    } else {
      const uint4 v = *reinterpret_cast<const uint4*>(ref.w + col / 2);
      const uint32_t words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float s = e4m3(ref.s[col / 16 + (i < 2 ? 0 : 1)]) * ref.g;
#pragma unroll
        for (int b = 0; b < 4; ++b) {
          const float2 f = e2m1x2_scaled((words[i] >> (8 * b)) & 0xffu);
          o[8 * i + 2 * b] = __float2bfloat16_rn(f.x * s);
          o[8 * i + 2 * b + 1] = __float2bfloat16_rn(f.y * s);
        }
      }
    }
  }
}

void require_quantised(const ExpertTable& t, int k, const char* who) {
  detail::require(t.format != ExpertFormat::bf16 && t.hidden % 32 == 0 && t.inter % 32 == 0 && k > 0 && k <= 32 &&
                      (t.format != ExpertFormat::fp8_block || (t.block_cols % 16 == 0 && t.block_rows > 0)),
                  who,
                  "expected a quantised table with hidden and inter multiples of 32, fp8 block columns a multiple of 16 "
                  "and k in (0, 32]; got format " + std::to_string(static_cast<int>(t.format)) + ", hidden " +
                      std::to_string(t.hidden) + ", inter " + std::to_string(t.inter) + ", block " +
                      std::to_string(t.block_rows) + "x" + std::to_string(t.block_cols) + ", k " + std::to_string(k));
}

int grid_of(int warps) { return (warps + k_warps - 1) / k_warps; }

}  // namespace

void launch_moe_gate_up_quant(const ExpertTable& table, const float* xn, const int32_t* ids, int k, float* act,
                              cudaStream_t stream) {
  require_quantised(table, k, "launch_moe_gate_up_quant");
  detail::require(table.hidden <= 8192 && detail::aligned16(xn), "launch_moe_gate_up_quant",
                  "hidden must be <= 8192 and xn 16-byte aligned, got " + std::to_string(table.hidden));
  const std::size_t smem = static_cast<std::size_t>(table.hidden) * sizeof(float);
  const int grid = grid_of(k * table.inter);
  if (table.format == ExpertFormat::fp8_block)
    gate_up_quant_kernel<ExpertFormat::fp8_block><<<grid, k_warps * 32, smem, stream>>>(table, xn, ids, k, act);
  else
    gate_up_quant_kernel<ExpertFormat::nvfp4><<<grid, k_warps * 32, smem, stream>>>(table, xn, ids, k, act);
  detail::check_launch();
}

void launch_moe_down_quant(const ExpertTable& table, const float* act, const int32_t* ids, const float* weights, int k,
                           float* out, cudaStream_t stream) {
  require_quantised(table, k, "launch_moe_down_quant");
  detail::require(static_cast<long long>(k) * table.inter <= 12288, "launch_moe_down_quant",
                  "k * inter must be <= 12288 (act in shared memory), got " + std::to_string(k * table.inter));
  const std::size_t smem = static_cast<std::size_t>(k) * table.inter * sizeof(float);
  const int grid = grid_of(table.hidden);
  if (table.format == ExpertFormat::fp8_block)
    down_quant_kernel<ExpertFormat::fp8_block><<<grid, k_warps * 32, smem, stream>>>(table, act, ids, weights, k, out);
  else
    down_quant_kernel<ExpertFormat::nvfp4><<<grid, k_warps * 32, smem, stream>>>(table, act, ids, weights, k, out);
  detail::check_launch();
}

void launch_dequantize_expert(const ExpertTable& table, const void* block, __nv_bfloat16* out, cudaStream_t stream) {
  require_quantised(table, 1, "launch_dequantize_expert");
  const QuantLayout L = layout_of(table);
  const int per = table.format == ExpertFormat::fp8_block ? 16 : 32;
  const std::size_t chunks = 3 * L.ih() / static_cast<std::size_t>(per);
  const int grid = static_cast<int>(std::min<std::size_t>((chunks + 255) / 256, 4096));
  const auto* b = static_cast<const uint8_t*>(block);
  if (table.format == ExpertFormat::fp8_block)
    dequantize_kernel<ExpertFormat::fp8_block><<<grid, 256, 0, stream>>>(L, b, out);
  else
    dequantize_kernel<ExpertFormat::nvfp4><<<grid, 256, 0, stream>>>(L, b, out);
  detail::check_launch();
}

}  // namespace servedeck::worker::cuda
