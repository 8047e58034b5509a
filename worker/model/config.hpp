// The architecture description of a checkpoint, parsed from its Hugging Face config.json.
//
// Supported model_type: "qwen3_moe" (Qwen3MoeForCausalLM) and "qwen3" (Qwen3ForCausalLM).
// The description is per layer (attention kind, MLP kind) with a model-wide router description,
// so architectures such as glm4_moe (sigmoid router with correction bias, shared expert, first
// dense layers, partial rotary) and DeepSeek-style MLA are added as new descriptions, not as
// rewrites of the forward pass's data.
//
// Field meanings follow transformers' Qwen3MoeConfig / Qwen3Config (configuration_qwen3_moe.py).
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

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
  sigmoid_bias_topk,  // sigmoid scores, top-k by score + e_score_correction_bias (glm4_moe; not yet run)
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
  std::int64_t shared_experts = 0;       // always-on experts (0 for Qwen3-MoE)
  double routed_scaling_factor = 1.0;    // multiplies the routed output (1 for Qwen3-MoE)
};

struct ModelDescription {
  std::string model_type;                // "qwen3_moe", "qwen3"
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
  double rotary_fraction = 1.0;          // share of head_dim that RoPE rotates (1 for Qwen3)
  bool qk_norm = true;                   // per-head RMSNorm on q and k (Qwen3: always)
  bool tie_word_embeddings = false;      // lm_head shares model.embed_tokens.weight
  MoeDescription moe;                    // meaningful when any layer has MlpKind::moe
  std::int64_t decoder_sparse_step = 1;  // as read, for reference
  std::vector<std::int64_t> mlp_only_layers;  // as read, for reference
  std::vector<LayerDescription> layers;  // size num_layers

  /// Bytes of fp32 K and V per token over all layers: layers * 2 * kv_heads * head_dim * 4.
  std::int64_t kv_bytes_per_token_f32() const;
};

/// The model_types this build can run, for error messages: "qwen3_moe, qwen3".
std::string supported_model_types();

/// Parses a config.json object. `origin` names the file in errors. Throws ConfigError: an
/// unsupported model_type (listing the supported ones), a missing or mistyped key, a value out
/// of range, or a feature this build does not implement (rope_scaling, sliding window,
/// attention bias, an activation other than silu).
ModelDescription parse_model_config(const nlohmann::json& config, std::string_view origin = "config.json");

/// Reads and parses `path`. Throws ConfigError.
ModelDescription load_model_config(const std::string& path);

}  // namespace servedeck::worker
