// The CUDA backend of the worker (Backend, worker/engine/backend.hpp) for qwen3_moe, qwen3 and
// glm4_moe (sigmoid router, shared expert, q/k/v bias, partial rotary), plain or YaRN RoPE:
// attention, norms, router, embeddings and lm_head resident in VRAM (bf16); routed experts in
// the expert store (worker/offload/expert_store.hpp): pinned host memory read through UVA, with
// a per-layer hot-expert cache in VRAM. The KV pool: bf16 in VRAM, paged (the engine's block
// tables, backend.hpp), allocated once (allocate_kv_pool), shared by every sequence and by the
// cached prefixes the engine reuses.
//
// A single token runs the batch-1 decode step (six fused launches per MoE layer, fused.cuh),
// captured once as a CUDA graph and replayed for every step of every sequence: the token, the
// position and the block table are device buffers the graph reads, and the routed experts are
// chosen on the device through pointer tables, so capture needs no device→host sync. More than one token runs the
// chunked prefill path (prefill_path.cu): dense projections and expert GEMMs through cuBLAS,
// attention for the chunk on the flash kernel (flash_attention.cuh), and the routed experts of
// each MoE layer staged in groups through a ring of VRAM buffers on a copy stream (hot experts
// read in place), long chunks routed in two parts so the copies overlap attention.
//
// Thread-safety: one forward() at a time (the engine's scheduler thread).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "worker/engine/backend.hpp"
#include "worker/cuda/kernels.cuh"
#include "worker/model/checkpoint.hpp"
#include "worker/model/config.hpp"

namespace servedeck::worker::cuda {

struct CudaBackendOptions {
  int device = 0;
  /// Share of each MoE layer's experts kept in the VRAM hot-expert cache, [0, 1]; 1 = all resident.
  double hot_fraction = 1.0;
  /// Explicit slots per layer; overrides hot_fraction when >= 0.
  int hot_slots = -1;
  /// VRAM budget in GiB (0 = none): hot slots are reduced so that resident weights + hot cache
  /// + the prefill staging ring + the KV pool (kv_cache_bytes) + its prefill copy of one layer
  /// + 2 GiB of workspace fit. Forces offload on a card where the model would fit.
  double vram_budget_gib = 0;
  /// Bytes of the KV pool the engine will allocate (--kv-cache-bytes), counted in
  /// vram_budget_gib; the pool itself is allocated by allocate_kv_pool.
  std::size_t kv_cache_bytes = 0;
  std::string profile_path;          // hot-expert profile to fill the cache from (optional)
  std::string capture_profile_path;  // when set, routing counts are written here on destruction
  bool use_graphs = true;
  /// Decode step: launch the fused kernels with programmatic dependent launch (sm_90).
  bool use_pdl = true;
  /// Prefill: tokens per chunk when forward() gets more than one token (each chunk stages the
  /// routed experts of every MoE layer once, so larger chunks move fewer bytes per token).
  int prefill_chunk = 4096;
  /// Prefill: experts per staging buffer.
  int stage_group = 8;
  /// Prefill: staging buffers, a ring: up to this many groups are in flight at once, so
  /// stage_buffers × stage_group × expert bytes of VRAM let that many cold experts copy ahead of
  /// compute (e.g. while the second part of a split layer computes its attention). 0 = auto:
  /// enough for one MoE layer's experts, ceil(num_experts / stage_group), at least 2 (16 for
  /// Qwen3-30B-A3B: 1.1 GiB); else >= 2.
  int stage_buffers = 0;
  /// Prefill: MoE layers of chunks of at least this many tokens run their attention-to-router
  /// part in two parts, the first quarter of the rows then the rest; the experts the first part
  /// routes to start copying while the second part computes (its attention is ~15/16 of the
  /// causal work). The split depends on the chunk length alone, so offload on and off run the
  /// same GEMMs and stay bit-identical. 0 = never split.
  int prefill_split_min_tokens = 1024;
  /// When false, multi-token forwards run token by token through the decode step (reference).
  bool staged_prefill = true;
  /// Prefill attention on the flash kernel (flash_attention.cuh, bf16 numerics) where the shape
  /// allows, for chunks whose last query sees more than flash_attention_min_keys keys; shorter
  /// ones (and all when false) use cuBLAS (TF32 on an fp32 copy of the bf16 rows) with a materialised score
  /// matrix. The flash kernel is as fast at 512 tokens and much faster beyond (docs/performance.md,
  /// 2026-11-30 "prefill, resident": 0.075 / 0.143 / 0.566 s for 512 / 4096 / 16384-token
  /// prompts against cuBLAS's 0.074 / 0.245 / 2.427 s), so it serves every length by default. Used for
  /// GQA groups of at least 4 (one warp per query head: smaller groups leave the multiprocessor
  /// nearly idle).
  bool flash_attention = true;
  int flash_attention_min_keys = 0;
};

/// Routing statistics since construction (or reset_stats()).
struct RoutingStats {
  uint64_t hot_hits = 0;     // routed experts served from VRAM
  uint64_t misses = 0;       // routed experts read from host memory over PCIe
  uint64_t tokens = 0;
  uint64_t staged_bytes = 0; // expert bytes copied host→device by the prefill path
  double hit_rate() const { return hot_hits + misses ? static_cast<double>(hot_hits) / (hot_hits + misses) : 0; }
};

class CudaBackend : public Backend {
 public:
  ~CudaBackend() override;

  std::size_t vocab_size() const override;
  /// bf16 K and V of every layer: layers × 2 × n_kv_heads × head_dim × 2 bytes.
  std::size_t kv_bytes_per_token() const override;
  std::string name() const override { return "cuda"; }
  /// The pool in VRAM (shape.block_tokens a multiple of 16: std::invalid_argument otherwise),
  /// zero-filled, with its device block table and the prefill buffers for its tokens; drops the
  /// earlier pool and the decode graph (captured again on the next decode step).
  void allocate_kv_pool(const KvPoolShape& shape) override;
  std::size_t kv_pool_allocations() const override;
  std::vector<float> forward(const KvView& kv, std::span<const int32_t> tokens, bool all_logits) override;
  /// The decode step's graph, whose last kernel picks the argmax on the device
  /// (launch_argmax_row): one int32 copied back instead of the logits row.
  int32_t forward_greedy(const KvView& kv, int32_t token) override;
  /// The decode step's graph, then launch_top_k_row on its logits: k (logit, id) pairs and the
  /// graph's argmax copied back instead of the row.
  TopLogits forward_top_k(const KvView& kv, int32_t token, int k) override;
  /// k_max_device_top_k, or less for a vocabulary whose blocks' candidates would not fit the merge.
  int max_top_k() const override;

  /// Device and pinned host allocations this backend made since it was made (load, the pool,
  /// buffers): constant once the pool is allocated, however many requests run.
  std::size_t allocations() const;
  /// Decode graphs captured since the backend was made: 1 after the first decode step, and
  /// unchanged by later steps, requests and context lengths (again after allocate_kv_pool or
  /// set_use_pdl).
  std::size_t graph_captures() const;

  /// GPU time of one decode step alone (the captured graph: every layer, final norm, lm_head
  /// and the greedy pick), replayed `reps` times back to back, in µs per step (median of 5 timed
  /// runs, CUDA events). Replays the last decoded token at its position, rewriting that KV row
  /// with the same values: the pool and the last pass's block table must be as that step left
  /// them. For the benchmark: forward_greedy()'s time per token minus this is the host's share.
  /// The routing counters (stats(), the captured profile) are restored afterwards. Throws
  /// std::logic_error when no decode step ran since the graph was captured.
  double decode_step_us(int reps);
  /// Chooses the prefill attention path from the next prefill on (CudaBackendOptions::
  /// flash_attention and flash_attention_min_keys); for the benchmark.
  void set_flash_attention(bool on, int min_keys);
  /// Sets CudaBackendOptions::prefill_split_min_tokens from the next prefill on (0 = never
  /// split); for the benchmark.
  void set_prefill_split(int min_tokens);
  /// Turns PDL on/off; the decode graph is captured again on the next step. For the benchmark.
  void set_use_pdl(bool on);
  /// Refills the hot-expert cache with `slots` experts per layer (profile order if loaded).
  void set_hot_slots(int slots);
  int hot_slots() const;
  RoutingStats stats();
  void reset_stats();
  /// Bytes of one routed expert block in the expert store (gate + up + down in its format).
  std::size_t expert_block_bytes() const;
  /// The routed experts' format in the expert store.
  ExpertFormat expert_format() const;
  /// VRAM bytes of resident (non-expert) weights.
  std::size_t resident_bytes() const;
  /// Host bytes mapped for experts and the expert bytes they hold (RSS / expert bytes ≈ their ratio).
  std::size_t host_bytes_mapped() const;
  std::size_t expert_bytes() const;
  const ModelDescription& description() const;
  /// Warnings gathered at load (profile mismatch, budget reductions).
  const std::vector<std::string>& warnings() const;

  struct Impl;

 private:
  friend std::unique_ptr<CudaBackend> make_cuda_backend(const Checkpoint&, CudaBackendOptions);
  friend std::unique_ptr<Backend> make_cuda_backend_from_dir(const std::string&, CudaBackendOptions);
  friend std::unique_ptr<CudaBackend> make_synthetic_cuda_backend(const ModelDescription&, uint64_t, CudaBackendOptions,
                                                                  ExpertFormat);
  explicit CudaBackend(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

/// Uploads `checkpoint`: resident weights as bf16 (BF16/F16/F32 converted, FP8/NVFP4
/// dequantised); routed experts in the checkpoint's format when every expert is stored in it
/// (quant_layout.cuh; otherwise dequantised to bf16, with a warning). Throws CudaError or
/// std::runtime_error naming what failed.
std::unique_ptr<CudaBackend> make_cuda_backend(const Checkpoint& checkpoint, CudaBackendOptions options = {});

/// A model of `description`'s shape with weights drawn from a seeded PRNG in memory (for
/// benchmarks at sizes whose checkpoint would not fit the machine's disk). `experts`: the
/// routed experts' format; fp8_block (128x128) and nvfp4 quantise the same bf16 draws in memory.
std::unique_ptr<CudaBackend> make_synthetic_cuda_backend(const ModelDescription& description, uint64_t seed,
                                                         CudaBackendOptions options = {},
                                                         ExpertFormat experts = ExpertFormat::bf16);

/// Opens the checkpoint directory `dir` (config.json + safetensors) and uploads it; the backend
/// owns the Checkpoint (it outlives the upload). Throws as Checkpoint::open and make_cuda_backend.
std::unique_ptr<Backend> make_cuda_backend_from_dir(const std::string& dir, CudaBackendOptions options = {});

/// True when a CUDA device is present and usable (for labelled GPU tests to skip cleanly).
bool cuda_device_available();

}  // namespace servedeck::worker::cuda
