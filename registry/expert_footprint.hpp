// The routed experts' bytes a checkpoint declares: how many MoE layers and experts its
// config.json describes, and what one expert weighs in the format its quantization config
// (config.json "quantization_config", hf_quant_config.json) names. Preflight compares the
// entry's host RAM, offload and VRAM declarations with it (docs/preflight.md, "experts").
//
// Bytes of one expert (gate and up (I, H), down (H, I); the worker's expert store holds exactly
// these bytes, docs/worker.md "Quantised checkpoints"):
//   bf16   3 · I · H · 2
//   fp8    3 · I · H + 4 · (2 · ⌈I/br⌉·⌈H/bc⌉ + ⌈H/br⌉·⌈I/bc⌉)     weight_block_size [br, bc]
//   nvfp4  3 · (I · H / 2 + I · H / 16 + 4)                        e2m1 pairs, e4m3 per 16, fp32 per tensor
// Experts are counted as stored in the format unless an exclusion pattern names experts
// ("experts" in a modules_to_not_convert / exclude_modules entry): then BF16.
#pragma once

#include <cstdint>
#include <string>

namespace servedeck::registry {

struct ExpertFootprint {
  bool found = false;        // config.json exists and describes routed experts
  std::string error;         // config.json or hf_quant_config.json unreadable or mistyped; "" otherwise
  std::string format;        // "bf16", "fp8", "nvfp4"
  int64_t moe_layers = 0;    // layers with routed experts
  int64_t experts = 0;       // routed experts per MoE layer
  int64_t hidden = 0;        // hidden_size (H)
  int64_t moe_intermediate = 0;  // moe_intermediate_size (I)
  uint64_t bytes_per_expert = 0;
  uint64_t resident_bytes = 0;   // every non-expert weight in bf16 (the CUDA backend keeps them so)

  /// moe_layers × experts × bytes_per_expert.
  uint64_t expert_bytes() const { return static_cast<uint64_t>(moe_layers) * static_cast<uint64_t>(experts) * bytes_per_expert; }
  /// moe_layers × slots × bytes_per_expert: a hot-expert cache of `slots` experts per layer.
  uint64_t hot_cache_bytes(int64_t slots) const {
    return static_cast<uint64_t>(moe_layers) * static_cast<uint64_t>(slots) * bytes_per_expert;
  }
};

/// Reads `checkpoint_dir`/config.json (and hf_quant_config.json when present), bounded
/// (parse_untrusted). Model types: any with "num_experts" or "n_routed_experts" and
/// "moe_intermediate_size" (qwen3_moe: decoder_sparse_step, mlp_only_layers; glm4_moe /
/// deepseek: first_k_dense_replace). found false without an error when there is no config.json or
/// it describes no routed experts.
ExpertFootprint discover_expert_footprint(const std::string& checkpoint_dir);

/// Bytes of one expert of (hidden H, moe_intermediate I) in `format` ("bf16", "fp8", "nvfp4";
/// fp8 with blocks br x bc), as above. 0 for an unknown format.
uint64_t expert_bytes_in(const std::string& format, int64_t hidden, int64_t moe_intermediate, int64_t br = 128,
                         int64_t bc = 128);

}  // namespace servedeck::registry
