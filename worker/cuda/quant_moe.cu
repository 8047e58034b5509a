// Quantised routed experts: decode gate/up + SwiGLU, decode down + weighted reduction, and the
// prefill's dequantisation into bf16 (quant_moe.cuh).
#include "worker/cuda/quant_moe.cuh"

#include <algorithm>
#include <string>
#include <type_traits>

#include "worker/cuda/dot.cuh"
#include "worker/cuda/fused_launch.cuh"
#include "worker/cuda/launch_check.cuh"
#include "worker/cuda/quant_dot.cuh"
#include "worker/cuda/quant_layout.cuh"

namespace servedeck::worker::cuda {

namespace {

constexpr int k_warps = 8;
using detail::chunk_cols;
using detail::chunked_x_index;
using detail::dot16_fp8;
using detail::dot32_fp4_stored;
using detail::e2m1x2_scaled;
using detail::e4m3;
using detail::e4m3x2;
using detail::row_of;
using detail::RowRef;

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
      return dot32_fp4_stored(v, sc, g[r], x + 4 * i, gs);
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

template <ExpertFormat F>
__global__ void __launch_bounds__(k_warps * 32) gate_up_quant_kernel(ExpertTable t, const float* __restrict__ xn,
                                                                     const int32_t* __restrict__ ids, int k,
                                                                     float* __restrict__ act) {
  SERVEDECK_TRACE_BLOCK();
  detail::wait_for_predecessor();  // the router wrote ids and xn
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

/// Hidden rows per block of the quantised down: each warp reads one expert's k_down_rows
/// consecutive rows, which are contiguous in the block (weights, and nvfp4's scales).
constexpr int k_down_rows = 8;

/// Uint4 chunks in flight per lane in the quantised down: at inter 768 a warp's whole span of
/// k_down_rows rows at once (nvfp4 192 chunks, fp8 384); wider experts take several batches.
template <ExpertFormat F>
constexpr int down_batch() { return F == ExpertFormat::fp8_block ? 12 : 6; }

/// Shared memory of the quantised down, in floats: act (k, inter) in chunked_x_index order per
/// expert, then per warp the partial dot of each chunk of its rows (k_down_rows · chunks per
/// row), then per warp nvfp4's scales of one batch (2 bytes per chunk: 32 · down_batch chunks).
struct DownSmem {
  int act, part, scales;  // floats: act's, each warp's partials, each warp's scales
  std::size_t bytes;
  __host__ __device__ DownSmem(ExpertFormat f, int k, int inter) {
    act = k * inter;
    part = k_down_rows * (inter / (f == ExpertFormat::fp8_block ? 16 : 32));
    scales = f == ExpertFormat::nvfp4 ? 32 * down_batch<ExpertFormat::nvfp4>() / 2 : 0;
    bytes = (static_cast<std::size_t>(act) + static_cast<std::size_t>(k_warps) * (part + scales)) * sizeof(float);
  }
};

// Block b: hidden rows h0 = b · k_down_rows .. + k_down_rows. Warp w takes the experts j = w,
// w + k_warps, ...: the span of its rows h0.. of expert j's down is contiguous (rows of
// inter / chunk_cols uint4 each), read in batches of uint4 chunks c0 + lane + 32 b, b < B
// (every load of the warp 512 contiguous bytes, whole 128-byte lines over PCIe); nvfp4's scales
// of a batch (contiguous too, 2 bytes per chunk) as one uint4 per lane of the first 4 B lanes,
// issued with the batch's weights and passed on through shared memory. Launched with PDL, the
// block reads the ids (written by gate/up's block 0 before it triggered, or by the unfolded
// router two launches back: handshakes.cuh H4), its first expert's pointer and that expert's
// first batch BEFORE its wait, so the down's weights stream while gate/up's last blocks finish;
// act and the routing weights only after. Each chunk's dot against act_j goes to shared memory;
// lane r < k_down_rows sums row r's chunks in order; then thread r sums weights[j] · row r of
// expert j over j = 0..k-1 in order and adds it to out[h0 + r].
template <ExpertFormat F>
__global__ void __launch_bounds__(k_warps * 32) down_quant_kernel(ExpertTable t, const float* __restrict__ act,
                                                                  const int32_t* __restrict__ ids,
                                                                  const float* __restrict__ weights, int k,
                                                                  float* __restrict__ out) {
  SERVEDECK_TRACE_BLOCK();
  extern __shared__ float as[];
  __shared__ float w[32];
  __shared__ float rowdot[32][k_down_rows];
  constexpr bool fp8 = F == ExpertFormat::fp8_block;
  constexpr int per = chunk_cols<F>(), B = down_batch<F>();
  static_assert(fp8 || 4 * B <= 32, "a batch's nvfp4 scales are one uint4 per lane");
  const QuantLayout L = layout_of(t);
  const DownSmem S(F, k, t.inter);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int n = t.inter / per, h0 = blockIdx.x * k_down_rows, rows = min(k_down_rows, t.hidden - h0), span = rows * n;
  RowRef d{};
  uint4 v[B];
  float s8[fp8 ? B : 1];  // fp8: each chunk's scale_inv, loaded with it
  uint4 s4 = make_uint4(0, 0, 0, 0);  // nvfp4: this lane's uint4 of the batch's scales
  auto select = [&](int j) { d = row_of<F>(reinterpret_cast<const uint8_t*>(t.experts[__ldcg(ids + j)]), L, 2, h0); };
  auto load = [&](int c0) {
    const uint4* wv = reinterpret_cast<const uint4*>(d.w);
#pragma unroll
    for (int b = 0; b < B; ++b) {
      const int c = c0 + lane + 32 * b;
      v[b] = c < span ? wv[c] : make_uint4(0, 0, 0, 0);
      if constexpr (fp8) s8[b] = c < span ? reinterpret_cast<const float*>(d.s)[(16 * (c % n)) / L.bc] : 0.f;
    }
    if constexpr (!fp8) {
      // The span's scales are span / 8 uint4 (span = 8 n: rows is k_down_rows, hidden % 32 == 0).
      const int q = c0 / 8 + lane;
      if (lane < 4 * B && q < span / 8) s4 = reinterpret_cast<const uint4*>(d.s)[q];
    }
  };
  if (warp < k) {
    select(warp);
    load(0);
  }
  detail::wait_for_predecessor();
  for (int i = threadIdx.x; i < k * t.inter; i += blockDim.x) as[(i / t.inter) * t.inter + chunked_x_index<F>(i % t.inter, t.inter)] = act[i];
  if (threadIdx.x < k) w[threadIdx.x] = weights[threadIdx.x];
  __syncthreads();
  float* part = as + S.act + warp * S.part;
  uint4* sc = reinterpret_cast<uint4*>(as + S.act + k_warps * S.part + warp * S.scales);
  const int gs = 4 * n;
  for (int j = warp; j < k; j += k_warps) {
    if (j != warp) select(j);
    const float* xj = as + j * t.inter;
    for (int c0 = 0; c0 < span; c0 += 32 * B) {
      if (j != warp || c0 > 0) load(c0);
      if constexpr (!fp8) {
        if (lane < 4 * B) sc[lane] = s4;
        __syncwarp();
      }
#pragma unroll
      for (int b = 0; b < B; ++b) {
        const int c = c0 + lane + 32 * b;
        if (c < span) {
          const int i = c % n;
          float p;
          if constexpr (fp8) {
            p = dot16_fp8(v[b], s8[b], xj + 4 * i, gs);
          } else {
            const uint16_t s2 = reinterpret_cast<const uint16_t*>(sc)[lane + 32 * b];
            p = dot32_fp4_stored(v[b], s2, d.g, xj + 4 * i, gs);
          }
          part[c] = p;
        }
      }
      __syncwarp();  // nvfp4: sc is rewritten by the next batch
    }
    if (lane < rows) {
      float acc = 0.f;
      for (int i = 0; i < n; ++i) acc += part[lane * n + i];
      rowdot[j][lane] = acc;
    }
    __syncwarp();  // part is rewritten for the warp's next expert
  }
  __syncthreads();
  if (threadIdx.x < rows) {
    float acc = 0.f;
    for (int j = 0; j < k; ++j) acc += w[j] * rowdot[j][threadIdx.x];
    out[h0 + threadIdx.x] += acc;
  }
}

/// One thread per 8 consecutive weights of the block (8 fp8 bytes or 4 nvfp4 bytes in, one
/// 16-byte store of 8 bf16 out: a warp writes 512 contiguous bytes), written as bf16
/// [gate; up; down]. Each value is __float2bfloat16_rn(q · scale), the decode kernels' q · scale.
template <ExpertFormat F>
__global__ void dequantize_kernel(QuantLayout L, const uint8_t* __restrict__ block, __nv_bfloat16* __restrict__ out) {
  const std::size_t ih = L.ih(), chunks_per_matrix = ih / 8;
  for (std::size_t c = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; c < 3 * chunks_per_matrix;
       c += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const int m = static_cast<int>(c / chunks_per_matrix);
    const std::size_t e0 = (c % chunks_per_matrix) * 8;  // first element in the matrix
    const int cols = m == 2 ? L.inter : L.hidden;
    const int r = static_cast<int>(e0 / cols), col = static_cast<int>(e0 % cols);
    const RowRef ref = row_of<F>(block, L, m, r);
    float f[8];
    if constexpr (F == ExpertFormat::fp8_block) {
      const uint2 v = *reinterpret_cast<const uint2*>(ref.w + col);
      const float s = reinterpret_cast<const float*>(ref.s)[col / L.bc];
      const uint32_t words[2] = {v.x, v.y};
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const float2 a = e4m3x2(static_cast<uint16_t>(words[i] & 0xffffu));
        const float2 b = e4m3x2(static_cast<uint16_t>(words[i] >> 16));
        f[4 * i] = a.x * s;
        f[4 * i + 1] = a.y * s;
        f[4 * i + 2] = b.x * s;
        f[4 * i + 3] = b.y * s;
      }
    } else {
      const uint32_t v = *reinterpret_cast<const uint32_t*>(ref.w + col / 2);
      const float s = e4m3(ref.s[col / 16]) * ref.g;
#pragma unroll
      for (int b = 0; b < 4; ++b) {
        const float2 q = e2m1x2_scaled((v >> (8 * b)) & 0xffu);
        f[2 * b] = q.x * s;
        f[2 * b + 1] = q.y * s;
      }
    }
    union {
      __nv_bfloat162 h[4];
      uint4 u;
    } packed;
#pragma unroll
    for (int i = 0; i < 4; ++i) packed.h[i] = __floats2bfloat162_rn(f[2 * i], f[2 * i + 1]);
    *reinterpret_cast<uint4*>(out + static_cast<std::size_t>(m) * ih + e0) = packed.u;
  }
}

void require_quantised(const ExpertTable& t, int k, const char* who) {
  detail::require(t.format != ExpertFormat::bf16 && t.hidden % 32 == 0 && t.inter % 32 == 0 && k > 0 && k <= 32 &&
                      (t.format != ExpertFormat::fp8_block || (t.block_cols > 0 && t.block_cols % 16 == 0 && t.block_rows > 0)),
                  who,
                  "expected a quantised table with hidden and inter multiples of 32, fp8 block columns a multiple of 16 "
                  "and k in (0, 32]; got format " + std::to_string(static_cast<int>(t.format)) + ", hidden " +
                      std::to_string(t.hidden) + ", inter " + std::to_string(t.inter) + ", block " +
                      std::to_string(t.block_rows) + "x" + std::to_string(t.block_cols) + ", k " + std::to_string(k));
}

int grid_of(int warps) { return (warps + k_warps - 1) / k_warps; }

}  // namespace

void launch_moe_gate_up_quant(const ExpertTable& table, const float* xn, const int32_t* ids, int k, float* act,
                              cudaStream_t stream, bool pdl) {
  require_quantised(table, k, "launch_moe_gate_up_quant");
  detail::require(table.hidden <= 8192 && detail::aligned16(xn), "launch_moe_gate_up_quant",
                  "hidden must be <= 8192 and xn 16-byte aligned, got " + std::to_string(table.hidden));
  const std::size_t smem = static_cast<std::size_t>(table.hidden) * sizeof(float);
  const int grid = grid_of(k * table.inter);
  if (table.format == ExpertFormat::fp8_block)
    detail::launch(gate_up_quant_kernel<ExpertFormat::fp8_block>, grid, k_warps * 32, smem, stream, pdl, table, xn, ids, k, act);
  else
    detail::launch(gate_up_quant_kernel<ExpertFormat::nvfp4>, grid, k_warps * 32, smem, stream, pdl, table, xn, ids, k, act);
  detail::check_launch();
}

void launch_moe_down_quant(const ExpertTable& table, const float* act, const int32_t* ids, const float* weights, int k,
                           float* out, cudaStream_t stream, bool pdl) {
  require_quantised(table, k, "launch_moe_down_quant");
  detail::require(table.format != ExpertFormat::fp8_block || table.block_rows % k_down_rows == 0, "launch_moe_down_quant",
                  "fp8 block rows must be a multiple of " + std::to_string(k_down_rows) + ", got " + std::to_string(table.block_rows));
  const DownSmem S(table.format, k, table.inter);
  const int grid = (table.hidden + k_down_rows - 1) / k_down_rows;
  // Both instantiations' attribute at once (they share a type: a static per `go` instantiation
  // would set only the first one used), at the largest layout: 12288 floats of act at k = 1.
  static const bool prepared = (detail::allow_dynamic_smem(down_quant_kernel<ExpertFormat::fp8_block>,
                                                           DownSmem(ExpertFormat::fp8_block, 1, 12288).bytes),
                                detail::allow_dynamic_smem(down_quant_kernel<ExpertFormat::nvfp4>, DownSmem(ExpertFormat::nvfp4, 1, 12288).bytes),
                                true);
  (void)prepared;
  auto go = [&](auto kernel) {
    detail::require(detail::fits_smem(kernel, S.bytes), "launch_moe_down_quant",
                    "k * inter = " + std::to_string(k * table.inter) + " needs " + std::to_string(S.bytes) +
                        " bytes of shared memory per block, more than the device allows");
    detail::launch(kernel, grid, k_warps * 32, S.bytes, stream, pdl, table, act, ids, weights, k, out);
  };
  detail::require(static_cast<long long>(k) * table.inter <= 12288, "launch_moe_down_quant",
                  "k * inter must be <= 12288 (act in shared memory), got " + std::to_string(k * table.inter));
  if (table.format == ExpertFormat::fp8_block)
    go(down_quant_kernel<ExpertFormat::fp8_block>);
  else
    go(down_quant_kernel<ExpertFormat::nvfp4>);
  detail::check_launch();
}

void launch_dequantize_expert(const ExpertTable& table, const void* block, __nv_bfloat16* out, cudaStream_t stream) {
  require_quantised(table, 1, "launch_dequantize_expert");
  detail::require(detail::aligned16(out), "launch_dequantize_expert", "out must be 16-byte aligned");
  const QuantLayout L = layout_of(table);
  const std::size_t chunks = 3 * L.ih() / 8;
  const int grid = static_cast<int>(std::min<std::size_t>((chunks + 255) / 256, 4096));
  const auto* b = static_cast<const uint8_t*>(block);
  if (table.format == ExpertFormat::fp8_block)
    dequantize_kernel<ExpertFormat::fp8_block><<<grid, 256, 0, stream>>>(L, b, out);
  else
    dequantize_kernel<ExpertFormat::nvfp4><<<grid, 256, 0, stream>>>(L, b, out);
  detail::check_launch();
}

}  // namespace servedeck::worker::cuda

SERVEDECK_TRACE_TU_SETTER(set_decode_trace_buffer_quant_moe)
