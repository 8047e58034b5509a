#include "worker/model/quantize.hpp"

#include <algorithm>
#include <cmath>

#include "worker/model/quant_format.hpp"

namespace servedeck::worker {

Fp8BlockQuantized quantize_fp8_block(const float* w, std::int64_t rows, std::int64_t cols, std::int64_t block_rows,
                                     std::int64_t block_cols) {
  const std::int64_t sr = (rows + block_rows - 1) / block_rows, sc = (cols + block_cols - 1) / block_cols;
  Fp8BlockQuantized out;
  out.weight.resize(static_cast<std::size_t>(rows * cols));
  out.scale_inv.resize(static_cast<std::size_t>(sr * sc));
  for (std::int64_t br = 0; br < sr; ++br)
    for (std::int64_t bc = 0; bc < sc; ++bc) {
      const std::int64_t r0 = br * block_rows, r1 = std::min(rows, r0 + block_rows);
      const std::int64_t c0 = bc * block_cols, c1 = std::min(cols, c0 + block_cols);
      float amax = 0.0f;
      for (std::int64_t r = r0; r < r1; ++r)
        for (std::int64_t c = c0; c < c1; ++c) amax = std::max(amax, std::fabs(w[r * cols + c]));
      const float scale_inv = amax > 0.0f ? amax / 448.0f : 1.0f;
      out.scale_inv[static_cast<std::size_t>(br * sc + bc)] = scale_inv;
      for (std::int64_t r = r0; r < r1; ++r)
        for (std::int64_t c = c0; c < c1; ++c)
          out.weight[static_cast<std::size_t>(r * cols + c)] = f32_to_e4m3(w[r * cols + c] / scale_inv);
    }
  return out;
}

Nvfp4Quantized quantize_nvfp4(const float* w, std::int64_t rows, std::int64_t cols) {
  Nvfp4Quantized out;
  out.weight.assign(static_cast<std::size_t>(rows * cols / 2), 0);
  out.scale.assign(static_cast<std::size_t>(rows * cols / 16), 0);
  float amax = 0.0f;
  for (std::int64_t i = 0; i < rows * cols; ++i) amax = std::max(amax, std::fabs(w[i]));
  out.global_scale = amax > 0.0f ? amax / (6.0f * 448.0f) : 1.0f;
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t g = 0; g < cols / 16; ++g) {
      const float* x = w + r * cols + g * 16;
      float bmax = 0.0f;
      for (int j = 0; j < 16; ++j) bmax = std::max(bmax, std::fabs(x[j]));
      const std::uint8_t sbits = f32_to_e4m3(bmax / (6.0f * out.global_scale));
      out.scale[static_cast<std::size_t>(r * (cols / 16) + g)] = sbits;
      const float s = e4m3_to_f32(sbits) * out.global_scale;
      if (!(s > 0.0f)) continue;  // the block rounds to zero
      std::uint8_t* packed = out.weight.data() + r * (cols / 2) + g * 8;
      for (int j = 0; j < 16; j += 2)
        packed[j / 2] = static_cast<std::uint8_t>(f32_to_e2m1(x[j] / s) | (f32_to_e2m1(x[j + 1] / s) << 4));
    }
  return out;
}

}  // namespace servedeck::worker
