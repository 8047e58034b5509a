// The expert store: routed-expert weights of every MoE layer in pinned host memory, read by the
// GPU through UVA device pointers, plus a per-layer hot-expert cache in VRAM.
//
// Host memory: one exact-size anonymous mapping per layer (n_experts × block bytes, rounded up
// to the 4 KiB page only), registered with cudaHostRegister(cudaHostRegisterMapped). note: the
// operating notes measured a power-of-two pinned pool (cudaHostAlloc granules) turning 19.0 GiB
// of weights into 33.8 GiB of RSS (1.85×); exact-size registration keeps host RSS / expert bytes
// near 1.0 (target ≤ 1.05).
//
// Expert block layout: bf16 row-major [gate (inter, hidden); up (inter, hidden); down (hidden, inter)],
// or, for a quantised checkpoint, its weights and scales as stored (FP8 block-scaled, NVFP4;
// worker/cuda/quant_layout.cuh), so experts stay in their format in host memory, in the hot cache
// and in the prefill's staging ring, and the bytes per expert are the format's.
//
// Hot-expert cache: for each layer, `slots` blocks in VRAM filled with that layer's most
// frequently routed experts according to a profile (per-layer counts); the device pointer table
// of the layer points hot experts at VRAM and the rest at their UVA host pointers, so a decode
// step picks experts on the device with no host round trip.
//
// Thread-safety: not thread-safe; owned by one backend.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <cuda_bf16.h>

#include "worker/cuda/kernels.cuh"
#include "worker/cuda/quant_layout.cuh"
#include "worker/offload/expert_profile.hpp"

namespace servedeck::worker::offload {

class ExpertStore {
 public:
  /// Maps (not yet registers) host memory for `n_layers` × `n_experts` blocks of `layout`
  /// (its hidden and inter: multiples of 8; quantised formats: of 32, and fp8 block columns a
  /// multiple of 16).
  ExpertStore(int n_layers, int n_experts, const cuda::QuantLayout& layout);
  ~ExpertStore();
  ExpertStore(const ExpertStore&) = delete;
  ExpertStore& operator=(const ExpertStore&) = delete;

  /// Host block of (layer, expert) to fill before register_host(): block_bytes() bytes.
  std::byte* host_block(int layer, int expert);

  /// Pins every layer's mapping (cudaHostRegister, mapped) and resolves UVA device pointers.
  void register_host();

  /// (Re)fills the hot-expert cache with `slots` experts per layer, chosen by `profile` (most
  /// routed first, ties to the lower id) or by id order when a layer has no usable profile row
  /// (a row of the wrong length warns once per layer in `warnings`). slots = n_experts makes
  /// every expert resident. Rebuilds the device pointer tables.
  void fill_hot_cache(int slots, const ExpertProfile* profile, std::vector<std::string>* warnings);

  /// The device pointer table of a layer, for launch_moe_decode.
  cuda::ExpertTable table(int layer) const;
  /// VRAM address of (layer, expert) in the hot-expert cache, or nullptr when it lives only in
  /// host memory (the prefill path then stages it through a VRAM buffer).
  const __nv_bfloat16* vram_block(int layer, int expert) const {
    return vram_[static_cast<std::size_t>(layer) * n_experts_ + expert];
  }
  /// Device array (n_layers × n_experts) of 1 = hot, 0 = host; for hit counting.
  const uint8_t* device_hot_flags() const { return d_hot_flags_; }

  int slots() const { return slots_; }
  int n_layers() const { return n_layers_; }
  int n_experts() const { return n_experts_; }
  std::size_t block_bytes() const { return block_bytes_; }
  const cuda::QuantLayout& layout() const { return layout_; }
  cuda::ExpertFormat format() const { return layout_.format; }
  /// Bytes of expert weights (n_layers × n_experts × block_bytes).
  std::size_t expert_bytes() const;
  /// Bytes of host memory mapped for them (page-rounded).
  std::size_t host_bytes_mapped() const;
  /// VRAM used by the hot-expert cache, bytes.
  std::size_t hot_cache_bytes() const;

 private:
  void free_hot_cache();

  int n_layers_, n_experts_;
  cuda::QuantLayout layout_;
  std::size_t block_bytes_;
  std::size_t layer_bytes_mapped_;
  std::vector<std::byte*> host_;            // per layer, mmap'ed
  std::vector<std::byte*> host_dev_;        // per layer, UVA device pointer of host_
  bool registered_ = false;
  int slots_ = 0;
  std::vector<std::byte*> hot_;             // per layer, VRAM (slots blocks)
  std::vector<const __nv_bfloat16**> d_tables_;  // per layer, device array of n_experts pointers
  uint8_t* d_hot_flags_ = nullptr;
  std::vector<const __nv_bfloat16*> vram_;  // (n_layers × n_experts) host copy: VRAM address or nullptr
};

}  // namespace servedeck::worker::offload
