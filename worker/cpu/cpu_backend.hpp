// The CPU reference backend: an fp32 forward pass for qwen3_moe, qwen3 and glm4_moe over
// BF16/F16/F32 weights read from the checkpoint's mmap; quantised linears (FP8 block-scaled,
// NVFP4) are dequantised to fp32 once at load (dequantized_weights.hpp). It is the ground truth
// for the CUDA kernels and the backend on machines without a GPU (tests/CI, the tiny default model).
//
// Per layer (transformers Qwen3MoeDecoderLayer / Qwen3DecoderLayer / Glm4MoeDecoderLayer):
//   h = x + o_proj(attn(rope(q_norm(q_proj(rms(x)) + q_bias)), rope(k_norm(k_proj(rms(x)) + k_bias)),
//                       v_proj(rms(x)) + v_bias))
//   x = h + mlp(rms(h))
// (biases only with attention_bias, q/k norms only with qk_norm). attn: causal GQA over the KV
// cache, scale 1/sqrt(head_dim); RoPE rotates the first rotary_dim dims of each head (rotate-half
// pairing) with the description's inverse frequencies (YaRN-blended and cos/sin scaled by its
// attention factor when rope_scaling is yarn). MoE mlp, softmax router (Qwen3-MoE): softmax over
// the router logits -> top-k -> renormalise when norm_topk_prob. Sigmoid router (glm4_moe):
// sigmoid of the fp32 logits, choice by sigmoid + e_score_correction_bias within the topk_group
// best of n_group groups, weights the chosen sigmoids renormalised, times routed_scaling_factor
// (config.hpp, RouterKind). Then the sum of weight * SwiGLU expert, plus the shared expert's
// SwiGLU when the model has one.
//
// KV pool (backend.hpp): one allocation at allocate_kv_pool, laid out block-major,
//   (num_blocks, layers, 2 [K, V], block_tokens, kv_heads * head_dim) in CpuBackendOptions::kv_dtype,
// so one block (every layer's K and V for block_tokens tokens) is contiguous. A forward pass
// writes its tokens' K and V rows through the sequence's block table, then, per layer, reads
// the rows of positions [0, length + n) back through the table (widened to fp32) and attends
// over them: the chunk's own tokens are read as stored too, so a prefill split anywhere and a
// whole one see the same K/V values. kv_bytes_per_token() = layers * 2 * kv_heads * head_dim *
// 2 (bf16) or 4 (f32).
//
// Thread-safety: as Backend: one forward() at a time; matmuls use up to `threads` threads.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "worker/engine/backend.hpp"
#include "worker/model/checkpoint.hpp"

namespace servedeck::worker {

struct CpuBackendOptions {
  /// Threads for matmuls and attention; 0 = std::thread::hardware_concurrency() (at least 1).
  std::size_t threads = 0;
  /// Element type of the stored K/V. bf16: the serving default (the pool's design, half the
  /// bytes; docs/worker.md states its accuracy effect); f32: exact, for the comparison against
  /// transformers' fp32 reference (servedeck-logits, docs/correctness.md).
  KvDtype kv_dtype = KvDtype::bf16;
};

/// A CPU backend over `checkpoint`, which must outlive it.
std::unique_ptr<Backend> make_cpu_backend(const Checkpoint& checkpoint, CpuBackendOptions options = {});

/// Opens the checkpoint in `dir` (Checkpoint::open, same errors) and returns a backend that owns it.
std::unique_ptr<Backend> make_cpu_backend(const std::string& dir, CpuBackendOptions options = {});

}  // namespace servedeck::worker
