// The architecture description of a checkpoint, parsed from its Hugging Face config.json.
//
// Supported model_type: "qwen3_moe" (Qwen3MoeForCausalLM), "qwen3" (Qwen3ForCausalLM) and
// "glm4_moe" (Glm4MoeForCausalLM: GLM-4.5, GLM-4.5-Air, GLM-4.6, GLM-4.7). The description is
// per layer (attention kind, MLP kind) with a model-wide router description, so an architecture
// is a new description, not a rewrite of the forward pass's data.
//
// Field meanings follow transformers' Qwen3MoeConfig / Qwen3Config / Glm4MoeConfig. glm4_moe's
// defaults are the class's where a checkpoint leaves a key out (partial_rotary_factor 0.5,
// n_group 1, topk_group 1, n_shared_experts 1, routed_scaling_factor 1, first_k_dense_replace 1,
// norm_topk_prob true, use_qk_norm false, attention_bias false, rms_norm_eps 1e-5); the released
// checkpoints set every one of them (GLM-4.5-Air: n_group 1, topk_group 1, attention_bias true,
// use_qk_norm false; GLM-4.5: use_qk_norm true, routed_scaling_factor 2.5, first 3 layers dense).
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "worker/model/rope.hpp"

namespace servedeck::worker {

/// Thrown for an unsupported or malformed config.json; names the key, expected and actual value.
struct ConfigError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

enum class AttentionKind {
  gqa,  // grouped-query attention: q/k/v/o projections, optional per-head q/k RMSNorm
};
enum class MlpKind {
  dense,  // SwiGLU: down(silu(gate(x)) * up(x))
  moe,    // routed SwiGLU experts (+ shared experts when MoeDescription::shared_experts > 0)
};
enum class RouterKind {
  softmax_topk,       // softmax over experts, top-k, renormalise when norm_topk_prob (Qwen3-MoE)
  // glm4_moe (noaux_tc): sigmoid of the fp32 router logits; the choice ranks sigmoid +
  // e_score_correction_bias, limited to the topk_group best of n_group expert groups (a group
  // scored by the sum of its best two); the weights are the chosen experts' sigmoids without
  // the bias, renormalised when norm_topk_prob, times routed_scaling_factor.
  sigmoid_bias_topk,
};

std::string_view to_string(AttentionKind k);
std::string_view to_string(MlpKind k);
std::string_view to_string(RouterKind k);

/// One decoder layer.
struct LayerDescription {
  AttentionKind attention = AttentionKind::gqa;
  MlpKind mlp = MlpKind::dense;
};

/// The routed-expert part of an MoE layer.
struct MoeDescription {
  std::int64_t num_experts = 0;          // routed experts per MoE layer
  std::int64_t top_k = 0;                // num_experts_per_tok
  std::int64_t intermediate_size = 0;    // moe_intermediate_size, per expert
  bool norm_topk_prob = false;           // renormalise the top-k weights to sum to 1
  RouterKind router = RouterKind::softmax_topk;
  std::int64_t shared_experts = 0;       // always-on experts (0 for Qwen3-MoE), n_shared_experts
  std::int64_t shared_intermediate_size = 0;  // their one SwiGLU's width: moe_intermediate_size x shared_experts
  double routed_scaling_factor = 1.0;    // multiplies the routed weights (1 for Qwen3-MoE)
  std::int64_t n_group = 1;              // sigmoid_bias_topk: expert groups (experts split evenly)
  std::int64_t topk_group = 1;           // sigmoid_bias_topk: groups a token may route into
};

struct ModelDescription {
  std::string model_type;                // "qwen3_moe", "qwen3", "glm4_moe"
  std::int64_t num_layers = 0;           // num_hidden_layers
  std::int64_t hidden_size = 0;
  std::int64_t intermediate_size = 0;    // dense MLP width (dense layers)
  std::int64_t num_heads = 0;            // num_attention_heads
  std::int64_t num_kv_heads = 0;         // num_key_value_heads (GQA groups)
  std::int64_t head_dim = 0;             // per head; defaults to hidden_size / num_heads
  std::int64_t vocab_size = 0;
  std::int64_t max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  double rotary_fraction = 1.0;          // share of head_dim that RoPE rotates (1 for Qwen3, 0.5 for GLM)
  RopeScaling rope_scaling;              // none, or YaRN (worker/model/rope.hpp)
  bool qk_norm = true;                   // per-head RMSNorm on q and k (Qwen3: always; glm4_moe: use_qk_norm)
  bool attention_bias = false;           // q/k/v projections carry a bias (glm4_moe attention_bias; o_proj never)
  bool tie_word_embeddings = false;      // lm_head shares model.embed_tokens.weight
  MoeDescription moe;                    // meaningful when any layer has MlpKind::moe
  std::int64_t decoder_sparse_step = 1;  // as read, for reference
  std::vector<std::int64_t> mlp_only_layers;  // as read, for reference
  std::int64_t first_k_dense_replace = 0;     // glm4_moe: layers [0, k) are dense, as read
  std::int64_t num_nextn_predict_layers = 0;  // glm4_moe: multi-token-prediction layers stored as
                                              // model.layers.{num_layers + i}.*; recognised, not run
  std::vector<LayerDescription> layers;  // size num_layers

  /// Dimensions of each head that RoPE rotates (the leading ones, rotate-half pairing):
  /// int(head_dim * rotary_fraction), as transformers; even.
  std::int64_t rotary_dim() const;
  /// rope_inv_freq(rope_theta, rotary_dim(), rope_scaling): rotary_dim() / 2 entries.
  std::vector<float> rope_inv_freq() const;
  /// Bytes of fp32 K and V per token over all layers: layers * 2 * kv_heads * head_dim * 4.
  std::int64_t kv_bytes_per_token_f32() const;
};

/// Why the CUDA backend cannot run `d`, or "" when it can: shapes past its kernels' limits (a
/// GQA group above 16 query heads per KV head, more than 1024 experts, a sigmoid router of more
/// than 64 groups). It runs qwen3_moe, qwen3 and glm4_moe, with plain or YaRN RoPE. Checked by
/// the worker before any device memory is taken and again by the CUDA backend's loader, so the
/// refusal is a clear start-up error.
std::string cuda_backend_unsupported(const ModelDescription& d);

/// The model_types this build can run, for error messages: "qwen3_moe, qwen3, glm4_moe".
std::string supported_model_types();

/// Parses a config.json object. `origin` names the file in errors. Throws ConfigError: an
/// unsupported model_type (listing the supported ones), a missing or mistyped key, a value out
/// of range, or a feature this build does not implement (a rope_scaling other than yarn,
/// sliding window, attention bias outside glm4_moe, an activation other than silu, a glm4_moe
/// scoring other than sigmoid).
ModelDescription parse_model_config(const nlohmann::json& config, std::string_view origin = "config.json");

/// Reads and parses `path`. Throws ConfigError.
ModelDescription load_model_config(const std::string& path);

/// `d` cut to its first `layers` decoder layers (dense and MoE as they were; the benchmarks'
/// models that do not fit the GPU machine whole). std::invalid_argument unless 1 <= layers <=
/// d.num_layers.
ModelDescription model_cut_to_layers(ModelDescription d, int layers);

}  // namespace servedeck::worker
