// The shape of Qwen3-30B-A3B (its published config.json, checked in at
// bench/moe_offload/qwen3-30b-a3b/config.json), with a chosen number of layers: the model the
// CUDA benchmarks and stress tests build synthetic backends of.
#pragma once

#include <cstddef>

#include "worker/model/config.hpp"

namespace servedeck::worker {

/// Qwen3-30B-A3B's description cut to `layers` decoder layers (all GQA attention + MoE): hidden
/// 2048, 32 query / 4 KV heads of 128, 128 experts top-8 of intermediate 768, vocab 151936,
/// QK-norm, rope theta 1e6, untied lm_head. `layers` must be >= 1 (the real model has 48).
inline ModelDescription qwen3_30b_a3b_shape(int layers) {
  ModelDescription d;
  d.model_type = "qwen3_moe";
  d.num_layers = layers;
  d.hidden_size = 2048;
  d.intermediate_size = 6144;
  d.num_heads = 32;
  d.num_kv_heads = 4;
  d.head_dim = 128;
  d.vocab_size = 151936;
  d.max_position_embeddings = 40960;
  d.rms_norm_eps = 1e-6;
  d.rope_theta = 1e6;
  d.qk_norm = true;
  d.tie_word_embeddings = false;
  d.moe.num_experts = 128;
  d.moe.top_k = 8;
  d.moe.intermediate_size = 768;
  d.moe.norm_topk_prob = true;
  d.layers.assign(static_cast<std::size_t>(layers), LayerDescription{AttentionKind::gqa, MlpKind::moe});
  return d;
}

}  // namespace servedeck::worker
