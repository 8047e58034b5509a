// Quantisers that write the published layouts (worker/model/quant_format.hpp) from fp32 values:
// the tiny-model writer's `--quantize`, and the benchmark's weights synthesised then quantised in
// memory.
//
// FP8 block-scaled, as transformers' Fp8Quantize and DeepSeek's reference: per block,
//   amax = max |w|, scale_inv = amax / 448 (1 for an all-zero block), q = e4m3(w / scale_inv).
// NVFP4, as ModelOpt's weight quantiser: per tensor weight_scale_2 = amax / (6 * 448) (1 for an
// all-zero tensor); per 16 elements of a row s = e4m3(amax16 / (6 * weight_scale_2)),
//   q = e2m1(w / (s * weight_scale_2)) (0 where s rounds to 0), packed low nibble first.
// Rounding is to nearest even throughout (f32_to_e4m3, f32_to_e2m1).
#pragma once

#include <cstdint>
#include <vector>

namespace servedeck::worker {

struct Fp8BlockQuantized {
  std::vector<std::uint8_t> weight;  // (rows, cols) e4m3
  std::vector<float> scale_inv;      // (ceil(rows/br), ceil(cols/bc))
};

/// Quantises the row-major (rows, cols) `w` with blocks of block_rows x block_cols (edge blocks
/// partial). Preconditions: rows, cols, block sizes > 0.
Fp8BlockQuantized quantize_fp8_block(const float* w, std::int64_t rows, std::int64_t cols, std::int64_t block_rows,
                                     std::int64_t block_cols);

struct Nvfp4Quantized {
  std::vector<std::uint8_t> weight;  // (rows, cols / 2) packed e2m1 pairs
  std::vector<std::uint8_t> scale;   // (rows, cols / 16) e4m3
  float global_scale = 1.0f;         // weight_scale_2
};

/// Quantises the row-major (rows, cols) `w`. Precondition: cols % 16 == 0.
Nvfp4Quantized quantize_nvfp4(const float* w, std::int64_t rows, std::int64_t cols);

}  // namespace servedeck::worker
