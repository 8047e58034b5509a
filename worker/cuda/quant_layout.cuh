// The byte layout of a quantised expert block (host and device): the three weights as the
// checkpoint stores them, then their scales, so one contiguous copy stages an expert and the
// host bytes equal the checkpoint's (the expert store's RSS / expert bytes stays ~1.0).
//
//   fp8_block  [gate e4m3 (I, H) | up e4m3 (I, H) | down e4m3 (H, I)
//               | gate scale_inv f32 (⌈I/br⌉, ⌈H/bc⌉) | up scale_inv | down scale_inv f32 (⌈H/br⌉, ⌈I/bc⌉)]
//   nvfp4      [gate e2m1 pairs (I, H/2) | up | down (H, I/2)
//               | gate scale e4m3 (I, H/16) | up | down (H, I/16) | gate, up, down weight_scale_2 f32]
//   bf16       [gate (I, H) | up | down (H, I)] bf16
// A quantised block is rounded up to 256 bytes (staging buffers and the hot cache place blocks back to
// back; every section starts 16-byte aligned when H and I are multiples of 32).
// NVFP4's layout is the checkpoint's linear one (row-major, scales per row); a native SM120
// path (block-scaled MMA) needs its scale-factor swizzle, which a separate layout would add.
#pragma once

#include <cstddef>
#include <cstdint>

#include "worker/cuda/kernels.cuh"

namespace servedeck::worker::cuda {

struct QuantLayout {
  ExpertFormat format = ExpertFormat::bf16;
  int hidden = 0, inter = 0;
  int br = 128, bc = 128;  // fp8_block

  __host__ __device__ static constexpr std::size_t cdiv(std::size_t a, std::size_t b) { return (a + b - 1) / b; }
  __host__ __device__ std::size_t ih() const { return static_cast<std::size_t>(inter) * static_cast<std::size_t>(hidden); }
  /// Bytes of one stored weight matrix (I·H elements).
  __host__ __device__ std::size_t weight_bytes() const {
    return format == ExpertFormat::bf16 ? 2 * ih() : format == ExpertFormat::fp8_block ? ih() : ih() / 2;
  }
  __host__ __device__ std::size_t gate_w() const { return 0; }
  __host__ __device__ std::size_t up_w() const { return weight_bytes(); }
  __host__ __device__ std::size_t down_w() const { return 2 * weight_bytes(); }
  __host__ __device__ std::size_t scales() const { return 3 * weight_bytes(); }
  /// fp8: scale counts of gate/up (per matrix) and of the down.
  __host__ __device__ std::size_t fp8_gu_scales() const { return cdiv(inter, br) * cdiv(hidden, bc); }
  __host__ __device__ std::size_t fp8_down_scales() const { return cdiv(hidden, br) * cdiv(inter, bc); }
  __host__ __device__ std::size_t gate_s() const { return scales(); }
  __host__ __device__ std::size_t up_s() const {
    return scales() + (format == ExpertFormat::fp8_block ? 4 * fp8_gu_scales() : ih() / 16);
  }
  __host__ __device__ std::size_t down_s() const {
    return scales() + 2 * (format == ExpertFormat::fp8_block ? 4 * fp8_gu_scales() : ih() / 16);
  }
  /// nvfp4: the three weight_scale_2 floats.
  __host__ __device__ std::size_t globals() const { return scales() + 3 * (ih() / 16); }
  /// Bytes the checkpoint's tensors hold (without the rounding).
  __host__ __device__ std::size_t stored_bytes() const {
    switch (format) {
      case ExpertFormat::bf16: return 3 * weight_bytes();
      case ExpertFormat::fp8_block: return 3 * weight_bytes() + 4 * (2 * fp8_gu_scales() + fp8_down_scales());
      case ExpertFormat::nvfp4: return globals() + 12;
    }
    return 0;
  }
  /// Bytes of the block: quantised, stored_bytes rounded up to 256; bf16 exactly stored_bytes.
  __host__ __device__ std::size_t block_bytes() const {
    return format == ExpertFormat::bf16 ? stored_bytes() : cdiv(stored_bytes(), 256) * 256;
  }
};

__host__ __device__ inline QuantLayout layout_of(const ExpertTable& t) {
  return QuantLayout{t.format, t.hidden, t.inter, t.block_rows, t.block_cols};
}

}  // namespace servedeck::worker::cuda
