// The random-initialised checkpoints whose transformers logits are recorded in
// tests/worker/cpu/fixtures/transformers/ (by scripts/record_transformers_logits.py on a machine
// with transformers), and the prompts they were recorded on. The checkpoints are not checked in:
// write_model writes them byte for byte from these options (same options and seed, same
// bytes), and the recording names the FNV-1a 64 hash of each model.safetensors it read, so a
// change to the writer shows as a hash mismatch, not as a numeric failure.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "worker/model/tiny_model.hpp"

namespace servedeck::worker::testing {

struct EquivalenceFixture {
  std::string name;          // fixtures/transformers/<name>.f32 holds the reference logits
  std::string what;          // what it covers, for messages and docs
  TinyModelOptions options;  // written with write_model (no tokenizer)
};

inline std::vector<EquivalenceFixture> equivalence_fixtures() {
  std::vector<EquivalenceFixture> out;
  {
    // GLM-4.5's structure: QK-norm on, routed_scaling_factor 2.5, first layer dense; plus
    // group-limited routing (the released checkpoints use n_group 1), an MTP layer's tensors.
    TinyModelOptions o = tiny_glm_options();
    o.vocab_size = 256;
    o.num_heads = 4;
    o.num_kv_heads = 2;
    o.head_dim = 32;  // q width 128 != hidden 64; RoPE on the first 16 dims
    o.num_experts = 16;
    o.top_k = 4;
    o.n_group = 4;
    o.topk_group = 2;
    o.routed_scaling_factor = 2.5;
    o.qk_norm = true;
    o.attention_bias = true;
    o.max_position_embeddings = 4096;
    o.seed = 45;
    out.push_back({"glm45_grouped_qknorm", "glm4_moe, QK-norm, q/k/v bias, n_group 4 / topk_group 2, routed_scaling 2.5, "
                                           "1 dense + 2 MoE layers, shared expert, partial rotary 0.5, MTP tensors",
                   o});
  }
  {
    // GLM-4.5-Air's structure: no QK-norm, q/k/v bias, n_group 1, routed_scaling 1,
    // norm_topk_prob off to cover the unnormalised weights.
    TinyModelOptions o = tiny_glm_options();
    o.vocab_size = 256;
    o.head_dim = 32;
    o.num_experts = 8;
    o.top_k = 3;
    o.norm_topk_prob = false;
    o.qk_norm = false;
    o.max_position_embeddings = 4096;
    o.num_nextn_predict_layers = 0;
    o.seed = 46;
    out.push_back({"glm45_air_no_qknorm", "glm4_moe, no QK-norm, q/k/v bias, n_group 1, norm_topk_prob false, "
                                          "1 dense + 2 MoE layers, shared expert, partial rotary 0.5",
                   o});
  }
  {
    // Qwen3-MoE (Qwen3-Coder's architecture) with YaRN as Qwen documents it for long contexts:
    // factor 4 over an original 32,768, max_position_embeddings 131,072.
    TinyModelOptions o;
    o.vocab_size = 256;
    o.num_layers = 2;
    o.head_dim = 64;
    o.num_heads = 4;
    o.num_kv_heads = 2;
    o.tie_word_embeddings = false;
    o.max_position_embeddings = 131072;
    o.yarn_factor = 4.0;
    o.yarn_original_max_position_embeddings = 32768;
    o.seed = 47;
    out.push_back({"qwen3_moe_yarn", "qwen3_moe, YaRN factor 4 / original 32768 (ramp over dims 11-20 of 32)", o});
  }
  return out;
}

/// Token-id prompts (ids < 256): 1, 37 and 150 tokens, from a fixed LCG.
inline std::vector<std::vector<std::int32_t>> equivalence_prompts() {
  std::vector<std::vector<std::int32_t>> out;
  std::uint32_t state = 2026;
  for (const std::size_t n : {1u, 37u, 150u}) {
    std::vector<std::int32_t> p(n);
    for (auto& t : p) {
      state = state * 1664525u + 1013904223u;
      t = static_cast<std::int32_t>((state >> 8) % 256u);
    }
    out.push_back(std::move(p));
  }
  return out;
}

/// FNV-1a 64 of `bytes` (the recording's checkpoint identity).
inline std::uint64_t fnv1a64(const std::string& bytes) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : bytes) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

}  // namespace servedeck::worker::testing
