// The routed experts' decode and prefill kernels for experts kept quantised (FP8 block-scaled,
// NVFP4; layout in quant_layout.cuh). Weights are dequantised in registers as they are read —
// from pinned host memory over PCIe (UVA) for a cold expert, from VRAM for a hot one — so a
// token moves the format's bytes, not bf16's.
//   FP8: e4m3 → fp16 pairs by the hardware conversion (cvt.rn.f16x2.e4m3x2, sm_89 and later),
//        times the block's fp32 scale_inv.
//   NVFP4: e2m1 nibbles → fp16 by bit placement (an e2m1 value v is the fp16 with its 3 bits in
//        the exponent/mantissa field, times 2^14), times e4m3(block scale) × weight_scale_2 —
//        software dequantisation, as SM90 has no FP4 arithmetic; SM120's block-scaled MMA would
//        read the same bytes.
// Each dequantised weight is q × scale in fp32, exactly the CPU reference's value
// (worker/model/quantized_weight.hpp); sums run in fp32 in a fixed order per output.
#pragma once

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "worker/cuda/kernels.cuh"

namespace servedeck::worker::cuda {

/// act[j, r] = silu(gate_j[r] · xn) * (up_j[r] · xn) for the k routed experts (ids on the
/// device). table: a quantised ExpertTable (fp8_block or nvfp4); xn: (hidden) fp32, 16-byte
/// aligned; act: (k, inter). hidden <= 8192; k in (0, 32] (std::invalid_argument otherwise).
/// pdl: launched with programmatic dependent launch (fused_launch.cuh); everything is read after
/// the block's wait.
void launch_moe_gate_up_quant(const ExpertTable& table, const float* xn, const int32_t* ids, int k, float* act,
                              cudaStream_t stream, bool pdl = false);

/// out[h] += sum_j weights[j] * (down_j[h] · act_j), j = 0..k-1 in order. act: (k, inter) fp32
/// with k * inter <= 12288 (it lives in shared memory). pdl: launched with programmatic
/// dependent launch; ids and the experts' first rows are then read before the block's wait, so
/// ids must have been written two launches back or by a predecessor that fenced them before it
/// triggered (handshakes.cuh H4); act, weights and out only after it.
void launch_moe_down_quant(const ExpertTable& table, const float* act, const int32_t* ids, const float* weights, int k,
                           float* out, cudaStream_t stream, bool pdl = false);

/// Writes the expert block at `block` (device memory, the table's layout) as a bf16 block
/// [gate; up; down] into `out` (3 * inter * hidden bf16, 16-byte aligned: std::invalid_argument
/// otherwise), for the prefill's cuBLAS GEMMs.
void launch_dequantize_expert(const ExpertTable& table, const void* block, __nv_bfloat16* out, cudaStream_t stream);

}  // namespace servedeck::worker::cuda
