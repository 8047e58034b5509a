// Loading a checkpoint for the CPU backend into a LoadedModel: text model (tokenizer + chat
// template), checkpoint (config.json, generation_config.json, safetensors), CPU backend, engine.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <memory>
#include <string>

#include "worker/server/worker_server.hpp"

namespace servedeck::worker {

struct CpuModelOptions {
  std::string dir;                  // checkpoint directory
  std::size_t max_model_len = 0;    // 0 → config.json max_position_embeddings
  std::size_t kv_cache_bytes = 0;   // the KV pool; 0 → max_model_len * kv_bytes_per_token (one full context)
  std::size_t prefill_chunk = EngineOptions{}.prefill_chunk;  // prompt tokens per prefill forward pass
  std::size_t threads = 0;          // 0 → hardware_concurrency
  std::string backend = "cpu";      // "cpu" | "cuda" (the CUDA backend, when built with CUDA)
  double hot_fraction = 1.0;        // cuda: share of each layer's experts in the VRAM hot-expert cache
  double vram_budget_gib = 0;       // cuda: 0 = none; else forces offload to fit
  std::size_t stage_buffers = 0;    // cuda: prefill staging ring, buffers of 8 experts; 0 = auto (CudaBackendOptions)
  std::string hot_profile;          // cuda: hot-expert profile to fill the cache from
  std::string capture_profile;      // cuda: write the routing profile here at exit
  /// cuda only: weights drawn in memory from this seed (cuda::make_synthetic_cuda_backend)
  /// instead of read from safetensors; `dir` then needs only config.json, the tokenizer files and
  /// optionally generation_config.json. For benchmark shapes whose checkpoint does not fit the
  /// disk (Qwen3-30B-A3B BF16 is 61 GB). The output is noise.
  std::optional<std::uint64_t> synthetic_seed;
};

/// generation_config.json's temperature, top_p and top_k in `dir` (absent fields and a missing
/// or malformed file leave SamplingParams' defaults).
SamplingParams read_sampling_defaults(const std::string& dir);

/// Loads everything, reporting progress. Throws std::runtime_error (or the loaders' own errors)
/// naming the file and the problem; also when max_model_len exceeds max_position_embeddings.
std::unique_ptr<LoadedModel> load_cpu_model(const CpuModelOptions& options, const ProgressFn& progress);

}  // namespace servedeck::worker
