// The quantised down as the second phase of the folded path's gate/up grid (internal to
// worker/cuda; launch_moe_experts_quant_normed in quant_moe.cuh). A block owns k_quant_down_rows
// hidden rows h0.. of the down; warp w owns the routed slots j = w, w + k_moe_warps, ... . Right
// after the ranking, before gate/up's own work, each warp copies its slots' spans — rows h0.. of
// down_j as stored (contiguous), their scales, nvfp4's weight_scale_2 — into the block's shared
// memory with cp.async, so the down's bytes cross PCIe while gate/up's still do: the layer's
// expert traffic is one stream, with no second launch, no first round trip after gate/up and no
// drain between them. Once every block of the grid has written its act rows (H5,
// handshakes.cuh), a warp stages its slots' act rows (chunked_x_index order) and computes from
// shared memory; the sums are launch_moe_down_quant's in the same order (per chunk the same
// dot, per row its chunks in order, then the slots in order), so out is bit-identical to it.
#pragma once

#include <cstddef>
#include <cstdint>

#include "worker/cuda/dot.cuh"
#include "worker/cuda/fused_moe_common.cuh"
#include "worker/cuda/handshakes.cuh"
#include "worker/cuda/quant_dot.cuh"
#include "worker/cuda/quant_layout.cuh"

namespace servedeck::worker::cuda {

/// Hidden rows of the down per block in the quantised down kernels (both launch_moe_down_quant
/// and the staged phase): a warp's span of one expert is k_quant_down_rows consecutive rows,
/// contiguous in the block. fp8 needs block rows a multiple of it (one scale row per span).
constexpr int k_quant_down_rows = 8;

/// Byte layout of the staged phase's dynamic shared memory after gate/up's (x and the expert
/// table, `base` bytes): k spans, then act (k · inter floats), then each warp's partial dots
/// (k_quant_down_rows · chunks per row floats). A span: the rows' weights, their scales (nvfp4
/// k_quant_down_rows · inter / 16 bytes; fp8 the block row's ⌈inter / bc⌉ floats, rounded up to
/// 16 bytes), then 16 bytes holding nvfp4's weight_scale_2 of the down.
struct QuantDownStage {
  std::size_t span_w = 0, span_s = 0, span = 0;  // bytes: a span's weights, its scales, the whole span
  std::size_t spans = 0, act = 0, part = 0, bytes = 0;  // offsets from the start of dynamic shared memory; bytes: the total
  int part_floats = 0;                                   // per warp
  __host__ __device__ QuantDownStage(const QuantLayout& L, int k, std::size_t base) {
    const bool fp8 = L.format == ExpertFormat::fp8_block;
    const std::size_t rows = k_quant_down_rows, inter = static_cast<std::size_t>(L.inter);
    span_w = rows * (fp8 ? inter : inter / 2);
    span_s = fp8 ? QuantLayout::cdiv(QuantLayout::cdiv(inter, static_cast<std::size_t>(L.bc)) * 4, 16) * 16 : rows * inter / 16;
    span = span_w + span_s + 16;
    spans = QuantLayout::cdiv(base, 16) * 16;
    act = spans + static_cast<std::size_t>(k) * span;
    part = act + static_cast<std::size_t>(k) * inter * 4;
    part_floats = k_quant_down_rows * static_cast<int>(inter / (fp8 ? 16 : 32));
    bytes = part + static_cast<std::size_t>(k_moe_warps) * static_cast<std::size_t>(part_floats) * 4;
  }
};

namespace detail {

/// cp.async of one 4-byte word (global src, 4-byte aligned; through L1: .ca is the only form of
/// this size), in the thread's current commit group.
__device__ __forceinline__ void copy_async4(void* dst, const void* src) {
  const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(d), "l"(src) : "memory");
}

/// This warp's copies of the span of slot j (rows h0.. of down_j in expert block `blk`) into
/// `span` (shared memory, QuantDownStage's span layout), as one commit group.
template <ExpertFormat F>
__device__ __forceinline__ void stage_down_span(const uint8_t* blk, const QuantLayout& L, const QuantDownStage& S, int h0,
                                                uint8_t* span, int lane) {
  const std::size_t inter = static_cast<std::size_t>(L.inter);
  const uint8_t *w, *s;
  if constexpr (F == ExpertFormat::fp8_block) {
    const std::size_t scols = QuantLayout::cdiv(inter, static_cast<std::size_t>(L.bc));
    w = blk + L.down_w() + static_cast<std::size_t>(h0) * inter;
    s = blk + L.down_s() + 4 * (static_cast<std::size_t>(h0 / L.br) * scols);
    for (int i = lane; i < static_cast<int>(scols); i += 32) copy_async4(span + S.span_w + 4 * i, s + 4 * i);
  } else {
    w = blk + L.down_w() + static_cast<std::size_t>(h0) * (inter / 2);
    s = blk + L.down_s() + static_cast<std::size_t>(h0) * (inter / 16);
    if (lane == 0) copy_async4(span + S.span_w + S.span_s, blk + L.globals() + 8);  // the down's weight_scale_2
    for (unsigned off = 16u * lane; off < S.span_s; off += 512u)
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(static_cast<unsigned>(__cvta_generic_to_shared(span + S.span_w + off))),
                   "l"(s + off)
                   : "memory");
  }
  stage_async(span, w, static_cast<unsigned>(S.span_w), lane, 32);  // the weights, and the commit
}

/// rowdot[r] = row r of the staged span · act_j (xj: act_j in shared memory, chunked_x_index
/// order), r < k_quant_down_rows: per chunk launch_moe_down_quant's dot into part, then lane r
/// sums row r's chunks in order. The warp's part is free again when it returns.
template <ExpertFormat F>
__device__ __forceinline__ void down_span_rowdots(const uint8_t* span, const QuantLayout& L, const QuantDownStage& S, const float* xj,
                                                  float* part, float* rowdot, int lane) {
  constexpr int per = chunk_cols<F>();
  const int n = L.inter / per, chunks = k_quant_down_rows * n, gs = 4 * n;
  const uint4* wv = reinterpret_cast<const uint4*>(span);
  for (int c = lane; c < chunks; c += 32) {
    const int i = c % n;
    if constexpr (F == ExpertFormat::fp8_block) {
      part[c] = dot16_fp8(wv[c], reinterpret_cast<const float*>(span + S.span_w)[(16 * i) / L.bc], xj + 4 * i, gs);
    } else {
      const float glob = *reinterpret_cast<const float*>(span + S.span_w + S.span_s) * 16384.f;
      part[c] = dot32_fp4_stored(wv[c], reinterpret_cast<const uint16_t*>(span + S.span_w)[c], glob, xj + 4 * i, gs);
    }
  }
  __syncwarp();
  if (lane < k_quant_down_rows) {
    float acc = 0.f;
    for (int i = 0; i < n; ++i) acc += part[lane * n + i];
    rowdot[lane] = acc;
  }
  __syncwarp();
}

/// The staged phase after a block's gate/up units (every thread of the block calls it; `smem`:
/// the dynamic shared memory, this block's first unit's spans already issued by
/// stage_down_span). Publishes the block's act rows (H5), waits for every block's, then for each
/// unit u = blockIdx.x, + gridDim.x, ... (units: hidden / k_quant_down_rows) computes
/// out[h0 + r] += Σ_j weights[j] · rowdot_j[r], the slots in order. blocks: the routed experts'
/// blocks (shared memory); act (k, inter) and weights (k) as gate/up's block 0 and every block
/// wrote them.
template <ExpertFormat F>
__device__ __forceinline__ void staged_down_phase(const QuantLayout& L, const QuantDownStage& S, const uint8_t* const* blocks, int k,
                                                  const float* act, const float* weights, float* out, const StepSync& sync, uint8_t* smem) {
  __shared__ float rowdot[32][k_quant_down_rows];
  __shared__ float w_s[32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, units = L.hidden / k_quant_down_rows;
  __syncthreads();  // the block's act rows written
  if (threadIdx.x == 0) {
    publish_count(sync.act_done);
    wait_for_count(sync.act_done, step_target(sync.epoch, gridDim.x));
  }
  __syncthreads();
  if (static_cast<int>(blockIdx.x) >= units) return;
  if (static_cast<int>(threadIdx.x) < k) w_s[threadIdx.x] = __ldcg(weights + threadIdx.x);
  float* as = reinterpret_cast<float*>(smem + S.act);
  for (int j = warp; j < k; j += k_moe_warps)
    for (int i = lane; i < L.inter; i += 32) as[j * L.inter + chunked_x_index<F>(i, L.inter)] = __ldcg(act + j * L.inter + i);
  float* part = reinterpret_cast<float*>(smem + S.part) + warp * S.part_floats;
  for (int u = blockIdx.x; u < units; u += gridDim.x) {
    const int h0 = u * k_quant_down_rows;
    if (u != static_cast<int>(blockIdx.x))
      for (int j = warp; j < k; j += k_moe_warps) stage_down_span<F>(blocks[j], L, S, h0, smem + S.spans + j * S.span, lane);
    stage_wait_all();
    __syncwarp();  // the warp's spans and act rows
    for (int j = warp; j < k; j += k_moe_warps)
      down_span_rowdots<F>(smem + S.spans + j * S.span, L, S, as + j * L.inter, part, rowdot[j], lane);
    __syncthreads();
    if (static_cast<int>(threadIdx.x) < k_quant_down_rows) {
      float acc = 0.f;
      for (int j = 0; j < k; ++j) acc += w_s[j] * rowdot[j][threadIdx.x];
      out[h0 + threadIdx.x] = __ldcg(out + h0 + threadIdx.x) + acc;
    }
    __syncthreads();  // rowdot and the spans are rewritten for the next unit
  }
}

}  // namespace detail

}  // namespace servedeck::worker::cuda
