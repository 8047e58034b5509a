// A Hugging Face checkpoint directory opened for inference: config.json -> ModelDescription,
// generation_config.json -> EOS/BOS ids, *.safetensors -> every weight resolved by its Hugging
// Face name and checked against the description's shapes before anything runs.
//
// Weights stay in the read-only mmap of the safetensors files as stored; the backends read or
// upload them from there. Linear weights (projections, MLPs, experts, router, lm_head) are
// WeightRefs: plain BF16/F16/F32, or quantised (FP8 block-scaled, NVFP4) as the checkpoint's
// quantization config declares (worker/model/quant_format.hpp); the CPU backend dequantises
// them at load, the CUDA backend keeps experts quantised. Norms and the embedding are plain.
// Tensor names (Qwen3 / Qwen3-MoE / GLM-4.5 layout):
//   model.embed_tokens.weight                               (vocab, hidden)
//   model.layers.N.input_layernorm.weight                   (hidden)
//   model.layers.N.self_attn.{q,k,v,o}_proj.weight          q (heads*head_dim, hidden),
//                                                           k/v (kv_heads*head_dim, hidden),
//                                                           o (hidden, heads*head_dim)
//   model.layers.N.self_attn.{q,k,v}_proj.bias              (heads*head_dim) / (kv_heads*head_dim), attention_bias only
//   model.layers.N.self_attn.{q,k}_norm.weight              (head_dim), qk_norm only
//   model.layers.N.post_attention_layernorm.weight          (hidden)
//   model.layers.N.mlp.{gate,up}_proj.weight                (intermediate, hidden)   dense layers
//   model.layers.N.mlp.down_proj.weight                     (hidden, intermediate)   dense layers
//   model.layers.N.mlp.gate.weight                          (num_experts, hidden)    MoE router
//   model.layers.N.mlp.experts.E.{gate,up}_proj.weight      (moe_inter, hidden)
//   model.layers.N.mlp.experts.E.down_proj.weight           (hidden, moe_inter)
//   model.layers.N.mlp.gate.e_score_correction_bias         (num_experts)            sigmoid router
//   model.layers.N.mlp.shared_experts.{gate,up}_proj.weight (shared_inter, hidden)   shared experts
//   model.layers.N.mlp.shared_experts.down_proj.weight      (hidden, shared_inter)
//   model.layers.{num_layers + i}.*                         glm4_moe's MTP layers (num_nextn_predict_layers):
//                                                           counted, never read
//   model.norm.weight                                       (hidden)
//   lm_head.weight                                          (vocab, hidden), absent when tied
//
// Thread-safety: immutable after open(); safe to read from several threads.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "worker/model/config.hpp"
#include "worker/model/quant_format.hpp"
#include "worker/model/quantized_weight.hpp"
#include "worker/model/safetensors.hpp"

namespace servedeck::worker {

/// Thrown for a checkpoint that cannot be used: missing file or tensor, wrong shape.
struct CheckpointError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// From generation_config.json (falling back to config.json's fields when absent).
struct GenerationConfig {
  std::vector<std::int32_t> eos_token_ids;   // "eos_token_id": an int or a list of ints
  std::optional<std::int32_t> bos_token_id;  // "bos_token_id"
};

struct ExpertWeights {
  WeightRef gate;  // (moe_inter, hidden)
  WeightRef up;    // (moe_inter, hidden)
  WeightRef down;  // (hidden, moe_inter)
};

struct LayerWeights {
  TensorRef input_norm;      // (hidden)
  WeightRef q_proj;          // (heads*head_dim, hidden)
  WeightRef k_proj;          // (kv_heads*head_dim, hidden)
  WeightRef v_proj;          // (kv_heads*head_dim, hidden)
  WeightRef o_proj;          // (hidden, heads*head_dim)
  TensorRef q_bias;          // (heads*head_dim), absent unless description.attention_bias
  TensorRef k_bias;          // (kv_heads*head_dim)
  TensorRef v_bias;          // (kv_heads*head_dim)
  TensorRef q_norm;          // (head_dim), absent unless description.qk_norm
  TensorRef k_norm;          // (head_dim)
  TensorRef post_attn_norm;  // (hidden)
  // MlpKind::dense
  WeightRef mlp_gate;        // (intermediate, hidden)
  WeightRef mlp_up;          // (intermediate, hidden)
  WeightRef mlp_down;        // (hidden, intermediate)
  // MlpKind::moe
  WeightRef router;          // (num_experts, hidden)
  TensorRef router_bias;     // (num_experts) e_score_correction_bias, RouterKind::sigmoid_bias_topk only
  std::vector<ExpertWeights> experts;  // num_experts entries
  ExpertWeights shared;      // (shared_inter, hidden) x2, (hidden, shared_inter); moe.shared_experts > 0 only
};

/// Calls fn(WeightRef&) for every linear weight of `layer` that is present (info non-null): the
/// one list of a layer's linears, for passes over all of them (dequantising, counting bytes).
template <typename Layer, typename Fn>
void for_each_linear(Layer& layer, Fn&& fn) {
  for (auto* w : {&layer.q_proj, &layer.k_proj, &layer.v_proj, &layer.o_proj, &layer.mlp_gate, &layer.mlp_up,
                  &layer.mlp_down, &layer.router})
    if (w->info) fn(*w);
  for (auto& e : layer.experts)
    for (auto* w : {&e.gate, &e.up, &e.down})
      if (w->info) fn(*w);
  for (auto* w : {&layer.shared.gate, &layer.shared.up, &layer.shared.down})
    if (w->info) fn(*w);
}

class Checkpoint {
 public:
  /// Opens the checkpoint in `dir`. Throws ConfigError (config.json), QuantConfigError (its
  /// quantization_config or hf_quant_config.json), SafetensorsError (a safetensors file or
  /// index) or CheckpointError (missing tensor, wrong shape or dtype, a missing or misshapen
  /// scale: "tensor 'model.layers.3.mlp.gate.weight': expected shape [8, 64], got [4, 64]").
  static Checkpoint open(const std::string& dir);

  const std::string& dir() const { return dir_; }
  const ModelDescription& description() const { return description_; }
  const GenerationConfig& generation() const { return generation_; }
  const TensorSet& tensors() const { return tensors_; }
  /// The declared quantisation (format plain when none).
  const QuantizationConfig& quantization() const { return quantization_; }
  /// Number of linear weights stored quantised (0 for a plain checkpoint).
  std::size_t quantized_weight_count() const { return quantized_.size(); }

  const TensorRef& embed_tokens() const { return embed_; }  // (vocab, hidden)
  const TensorRef& final_norm() const { return final_norm_; }  // (hidden)
  /// (vocab, hidden): lm_head.weight, or the embedding when tie_word_embeddings.
  const WeightRef& lm_head() const { return lm_head_; }
  const std::vector<LayerWeights>& layers() const { return layers_; }
  /// Tensors of the multi-token-prediction layers (model.layers.{num_layers + i}.*, i <
  /// num_nextn_predict_layers) found in the checkpoint: recognised and left unread.
  std::size_t skipped_mtp_tensors() const { return skipped_mtp_tensors_; }

 private:
  std::string dir_;
  ModelDescription description_;
  GenerationConfig generation_;
  TensorSet tensors_;
  QuantizationConfig quantization_;
  std::vector<std::unique_ptr<QuantizedWeight>> quantized_;  // what quantised WeightRefs point at
  TensorRef embed_;
  TensorRef final_norm_;
  WeightRef lm_head_;
  std::vector<LayerWeights> layers_;
  std::size_t skipped_mtp_tensors_ = 0;
};

/// Parses a generation_config.json object (eos_token_id int or list, bos_token_id int).
/// `origin` names the file in errors. Throws CheckpointError on a mistyped field.
GenerationConfig parse_generation_config(const std::string& json_text, const std::string& origin);

/// The end-of-turn and BOS ids of checkpoint directory `dir`: from generation_config.json when it
/// exists, else from config.json (as Checkpoint::open). Throws CheckpointError naming the file
/// that could not be read or parsed.
GenerationConfig load_generation_config(const std::string& dir);

}  // namespace servedeck::worker
