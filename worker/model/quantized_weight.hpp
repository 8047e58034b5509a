// A linear weight of a checkpoint as it is stored: plain (BF16/F16/F32) or quantised
// (worker/model/quant_format.hpp gives the formats), resolved and validated by name, and read
// back as fp32 rows.
//
// Thread-safety: immutable once resolved; reads may run concurrently.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "worker/model/quant_format.hpp"
#include "worker/model/safetensors.hpp"

namespace servedeck::worker {

/// A quantised linear weight of logical shape (rows, cols), row-major (out, in) as Hugging Face
/// stores linears.
struct QuantizedWeight {
  WeightFormat format = WeightFormat::fp8_block;
  std::string module;            // e.g. "model.layers.0.mlp.experts.3.up_proj"
  std::int64_t rows = 0;         // output features
  std::int64_t cols = 0;         // input features
  TensorRef weight;              // fp8_block: F8_E4M3 (rows, cols); nvfp4: U8 (rows, cols / 2)
  TensorRef scale;               // fp8_block: F32/BF16 (ceil(rows/br), ceil(cols/bc)); nvfp4: F8_E4M3 (rows, cols/16)
  float global_scale = 1.0f;     // nvfp4: weight_scale_2; fp8_block: 1
  std::int64_t block_rows = 1;   // rows one scale covers: fp8 weight_block_size[0]; nvfp4 1
  std::int64_t block_cols = 16;  // columns one scale covers: fp8 weight_block_size[1]; nvfp4 16

  /// Columns of the scale matrix: ceil(cols / block_cols).
  std::int64_t scale_cols() const { return (cols + block_cols - 1) / block_cols; }
  /// The scale of block (row / block_rows, col / block_cols) as fp32, global_scale not applied.
  float block_scale(std::int64_t row, std::int64_t col) const;
  /// Bytes as stored: weight + scale (+ 4 for weight_scale_2).
  std::uint64_t stored_bytes() const;
};

/// A linear weight as the model reads it. Plain: the TensorRef of the stored tensor, `quant`
/// null. Quantised: the TensorRef of the stored `weight` tensor (its info/bytes are the packed
/// storage, never plain numbers) and `quant` describing how to read it.
struct WeightRef : TensorRef {
  const QuantizedWeight* quant = nullptr;

  WeightFormat format() const { return quant ? quant->format : WeightFormat::plain; }
};

/// Writes rows [row0, row0 + n) of `w` as fp32 into `out` (n x w.cols). Preconditions (checked
/// at resolution): the bounds lie inside the weight.
void dequantize_rows(const QuantizedWeight& w, std::int64_t row0, std::int64_t n, float* out);

/// Bytes of one (rows, cols) linear in `format` (for sizing the expert store and the registry's
/// arithmetic): plain bf16 2·r·c; fp8_block r·c + 4·ceil(r/br)·ceil(c/bc); nvfp4 r·c/2 + r·c/16 + 4.
std::uint64_t linear_bytes(WeightFormat format, std::int64_t rows, std::int64_t cols, std::int64_t block_rows = 128,
                           std::int64_t block_cols = 128);

/// A linear resolved in a checkpoint: `ref` always set; `owned` holds the QuantizedWeight that
/// `ref.quant` points at (null for a plain weight).
struct ResolvedLinear {
  WeightRef ref;
  std::unique_ptr<QuantizedWeight> owned;
};

/// Resolves linear `module` (its tensors are `module`.weight and the format's scales) of logical
/// shape (rows, cols) in `set`. The stored dtype decides the format: BF16/F16/F32 is plain (any
/// sibling scale is ignored); F8_E4M3 must be declared by `config` as fp8_block and U8 as nvfp4,
/// and the module must not be one `config` excludes. Every tensor's dtype and shape are checked
/// against the format before any byte is read, and nvfp4's weight_scale_2 must be a finite
/// positive number. `dir` prefixes messages. Throws CheckpointError naming the tensor, what was
/// expected and what it holds ("tensor 'M.weight_scale_inv': expected shape [1, 1] (...), got [2, 1]").
ResolvedLinear resolve_linear(const TensorSet& set, const QuantizationConfig& config, const std::string& module,
                              std::int64_t rows, std::int64_t cols, const std::string& dir);

}  // namespace servedeck::worker
