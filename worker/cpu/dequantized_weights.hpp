// The CPU backend's view of a checkpoint's linear weights: quantised ones (FP8 block-scaled,
// NVFP4) dequantised once at load into fp32 tensors it owns, plain ones left in the mmap.
// Dequantising to fp32 is exact (e4m3/e2m1 times fp32 scales), so the CPU forward pass over a
// quantised checkpoint is the reference for the CUDA kernels that dequantise in registers.
// Cost: 4 bytes of host memory per quantised weight element (the CPU backend serves tiny and
// test models; the CUDA backend keeps experts quantised).
//
// Thread-safety: immutable after construction.
#pragma once

#include <memory>
#include <vector>

#include "worker/model/checkpoint.hpp"

namespace servedeck::worker::cpu {

class DequantizedWeights {
 public:
  /// Copies the layer weights of `checkpoint` (which must outlive this), dequantising every
  /// quantised linear (for_each_linear and lm_head) with `threads` threads.
  DequantizedWeights(const Checkpoint& checkpoint, std::size_t threads);

  /// As Checkpoint::layers(), every WeightRef plain (BF16/F16/F32 in the mmap, or F32 here).
  const std::vector<LayerWeights>& layers() const { return layers_; }
  const WeightRef& lm_head() const { return lm_head_; }
  /// Weights dequantised at load, and their fp32 bytes.
  std::size_t dequantized_count() const { return owned_.size(); }
  std::size_t dequantized_bytes() const;

 private:
  struct Owned {
    TensorInfo info;
    std::vector<float> data;
  };
  void dequantize(WeightRef& w, std::size_t threads);

  std::vector<LayerWeights> layers_;
  WeightRef lm_head_;
  std::vector<std::unique_ptr<Owned>> owned_;
};

}  // namespace servedeck::worker::cpu
