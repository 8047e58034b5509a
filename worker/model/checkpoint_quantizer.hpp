// Quantising a BF16 checkpoint on disk into a published layout (`servedeck-worker quantize`):
// the linears quantize_linears converts (quantized_writer.hpp), shard by shard, so a checkpoint
// larger than host RAM needs only one shard's tensors in memory at a time. What is not a
// safetensors shard or its index (config.json aside: it gains "quantization_config"; tokenizer
// files, chat templates, generation_config.json) is copied as it is.
#pragma once

#include <cstdint>
#include <string>

#include "worker/model/quant_format.hpp"

namespace servedeck::worker {

/// What quantize_checkpoint wrote.
struct QuantizeSummary {
  int shards = 0;                      // safetensors files written
  std::int64_t linears_quantized = 0;  // weights converted (the rest kept as they were)
  std::uint64_t bytes_in = 0;          // tensor bytes read
  std::uint64_t bytes_out = 0;         // tensor bytes written
};

/// Writes `in_dir`'s checkpoint (model.safetensors, or the shards model.safetensors.index.json
/// names, BF16 linears) into `out_dir` (created, or an empty directory) with every linear weight
/// in `format` (fp8_block or nvfp4) except the routers, lm_head and MTP routers
/// (default_exclusions over num_hidden_layers + num_nextn_predict_layers) — the values and
/// layout make-tiny-model --quantize writes, so quantising a BF16 tiny model gives the same
/// bytes. Shards keep their file names. Throws std::runtime_error naming the file or tensor: a
/// format that is plain, an input whose config.json already declares a quantization_config or
/// whose num_hidden_layers is not in [1, 100000], a linear that is not a non-empty 2-D BF16
/// tensor, a tensor name written twice, no linear at all, an unreadable, malformed or too deeply
/// nested file, a shard that is not a regular file, or an out_dir that is in_dir or not empty.
QuantizeSummary quantize_checkpoint(const std::string& in_dir, const std::string& out_dir, WeightFormat format);

}  // namespace servedeck::worker
