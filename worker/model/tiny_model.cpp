#include "worker/model/tiny_model.hpp"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "worker/model/glm_fixture_tokenizer.hpp"
#include "worker/model/planted_switch.hpp"
#include "worker/model/quantized_writer.hpp"
#include "worker/model/safetensors_writer.hpp"

namespace servedeck::worker {

namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

std::uint64_t splitmix64(std::uint64_t& state) {
  std::uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

std::uint64_t fnv1a(const std::string& s) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

/// `count` BF16 values: mean + std * u, u uniform with unit variance (u in [-sqrt 3, sqrt 3]).
TensorToWrite random_tensor(const std::string& name, std::vector<std::int64_t> shape, double mean, double stddev,
                            std::uint64_t seed) {
  TensorToWrite t;
  t.name = name;
  t.dtype = Dtype::bf16;
  t.shape = std::move(shape);
  std::uint64_t count = 1;
  for (auto d : t.shape) count *= static_cast<std::uint64_t>(d);
  t.data.resize(count * 2);
  std::uint64_t state = seed ^ fnv1a(name);
  const double a = std::sqrt(3.0) * stddev;
  for (std::uint64_t i = 0; i < count; ++i) {
    // 53 random bits -> [0, 1).
    const double r = static_cast<double>(splitmix64(state) >> 11) * (1.0 / 9007199254740992.0);
    const auto v = static_cast<float>(mean + a * (2.0 * r - 1.0));
    const std::uint16_t b = float_to_bf16(v);
    t.data[2 * i] = static_cast<std::byte>(b & 0xff);
    t.data[2 * i + 1] = static_cast<std::byte>(b >> 8);
  }
  return t;
}

/// As random_tensor, stored as F32 (e_score_correction_bias, kept in fp32 as the checkpoints ship it).
TensorToWrite random_tensor_f32(const std::string& name, std::vector<std::int64_t> shape, double mean, double stddev,
                                std::uint64_t seed) {
  TensorToWrite t;
  t.name = name;
  t.dtype = Dtype::f32;
  t.shape = std::move(shape);
  std::uint64_t count = 1;
  for (auto d : t.shape) count *= static_cast<std::uint64_t>(d);
  t.data.resize(count * 4);
  std::uint64_t state = seed ^ fnv1a(name);
  const double a = std::sqrt(3.0) * stddev;
  for (std::uint64_t i = 0; i < count; ++i) {
    const double r = static_cast<double>(splitmix64(state) >> 11) * (1.0 / 9007199254740992.0);
    const auto v = static_cast<float>(mean + a * (2.0 * r - 1.0));
    std::memcpy(t.data.data() + 4 * i, &v, 4);
  }
  return t;
}

float bf16_at(const TensorToWrite& t, std::uint64_t i) {
  const auto lo = static_cast<std::uint32_t>(t.data[2 * i]);
  const auto hi = static_cast<std::uint32_t>(t.data[2 * i + 1]);
  const std::uint32_t bits = (hi << 24) | (lo << 16);
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

void set_bf16(TensorToWrite& t, std::uint64_t i, float v) {
  const std::uint16_t b = float_to_bf16(v);
  t.data[2 * i] = static_cast<std::byte>(b & 0xff);
  t.data[2 * i + 1] = static_cast<std::byte>(b >> 8);
}

/// Checks `r` against the vocabulary; throws naming the offending id.
void check_planted(const PlantedReply& r, std::int64_t vocab) {
  auto in_vocab = [&](std::int64_t id, const char* what) {
    if (id < 0 || id >= vocab)
      throw std::runtime_error(std::string("planted reply: ") + what + " id " + std::to_string(id) +
                               " is outside the vocabulary [0, " + std::to_string(vocab) + ")");
  };
  if (r.after.empty()) throw std::runtime_error("planted reply: no start token ('after' is empty)");
  for (auto id : r.after) in_vocab(id, "start");
  in_vocab(r.end_token, "end");
  for (auto id : r.tokens)
    if (id == r.end_token)
      throw std::runtime_error("planted reply: the end token " + std::to_string(id) + " is also in the reply");
  for (auto id : r.after)
    if (id == r.end_token)
      throw std::runtime_error("planted reply: the end token " + std::to_string(id) + " is also a start token");
  for (std::size_t i = 0; i < r.tokens.size(); ++i) {
    in_vocab(r.tokens[i], "reply");
    for (std::size_t j = 0; j < i; ++j)
      if (r.tokens[j] == r.tokens[i])
        throw std::runtime_error("planted reply: token id " + std::to_string(r.tokens[i]) +
                                 " appears twice (each reply token must have one successor)");
    for (auto a : r.after)
      if (a == r.tokens[i])
        throw std::runtime_error("planted reply: token id " + std::to_string(a) + " is both a start and in the reply");
  }
}

/// Overwrites the planted rows of `lm_head` (vocab x h) from `embed` (vocab x h); see PlantedReply.
void plant_reply(const PlantedReply& r, const TensorToWrite& embed, TensorToWrite& lm_head, std::int64_t h) {
  auto set_row = [&](std::int64_t row, const std::vector<std::int64_t>& from) {
    for (std::int64_t k = 0; k < h; ++k) {
      float sum = 0.0F;
      for (auto f : from) sum += bf16_at(embed, static_cast<std::uint64_t>(f * h + k));
      set_bf16(lm_head, static_cast<std::uint64_t>(row * h + k), static_cast<float>(r.gain) * sum);
    }
  };
  set_row(r.tokens[0], r.after);
  for (std::size_t i = 1; i < r.tokens.size(); ++i) set_row(r.tokens[i], {r.tokens[i - 1]});
  set_row(r.end_token, {r.tokens.back()});
}

void write_text(const fs::path& p, const std::string& text) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out << text;
  if (!out) throw std::runtime_error("cannot write '" + p.string() + "'");
}

void copy_file_exact(const fs::path& from, const fs::path& to) {
  std::ifstream in(from, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read '" + from.string() + "' (expected Qwen3's tokenizer files there)");
  std::ofstream out(to, std::ios::binary | std::ios::trunc);
  out << in.rdbuf();
  if (!out) throw std::runtime_error("cannot write '" + to.string() + "'");
}

bool is_glm(const TinyModelOptions& o) { return o.model_type == "glm4_moe"; }

json glm_config_json(const TinyModelOptions& o) {
  // The keys of GLM-4.5-Air's config.json, in its order.
  return json{
      {"architectures", {"Glm4MoeForCausalLM"}},
      {"attention_bias", o.attention_bias},
      {"attention_dropout", 0.0},
      // <|endoftext|>; null in a vocabulary too small to hold it (transformers refuses a padding id
      // outside the embedding)
      {"pad_token_id", o.vocab_size > 151329 ? json(151329) : json(nullptr)},
      {"eos_token_id", {151329, 151336, 151338}},
      {"head_dim", o.head_dim},
      {"hidden_act", "silu"},
      {"hidden_size", o.hidden_size},
      {"partial_rotary_factor", o.partial_rotary_factor},
      {"initializer_range", 0.02},
      {"intermediate_size", o.intermediate_size},
      {"max_position_embeddings", o.max_position_embeddings},
      {"model_type", "glm4_moe"},
      {"moe_intermediate_size", o.moe_intermediate_size},
      {"norm_topk_prob", o.norm_topk_prob},
      {"num_attention_heads", o.num_heads},
      {"n_group", o.n_group},
      {"topk_group", o.topk_group},
      {"n_routed_experts", o.num_experts},
      {"n_shared_experts", o.n_shared_experts},
      {"routed_scaling_factor", o.routed_scaling_factor},
      {"num_experts_per_tok", o.top_k},
      {"first_k_dense_replace", o.first_k_dense_replace},
      {"num_hidden_layers", o.num_layers},
      {"num_key_value_heads", o.num_kv_heads},
      {"rms_norm_eps", o.rms_norm_eps},
      {"rope_scaling", nullptr},
      {"rope_theta", o.rope_theta},
      {"num_nextn_predict_layers", o.num_nextn_predict_layers},
      {"tie_word_embeddings", o.tie_word_embeddings},
      {"torch_dtype", "bfloat16"},
      {"use_cache", true},
      {"use_qk_norm", o.qk_norm},
      {"vocab_size", o.vocab_size},
  };
}

json config_json(const TinyModelOptions& o) {
  if (is_glm(o)) return glm_config_json(o);
  const bool moe = o.model_type == "qwen3_moe";
  json c = {
      {"architectures", {moe ? "Qwen3MoeForCausalLM" : "Qwen3ForCausalLM"}},
      {"model_type", o.model_type},
      {"attention_bias", false},
      {"attention_dropout", 0.0},
      {"bos_token_id", 151643},
      {"eos_token_id", 151645},
      {"head_dim", o.head_dim},
      {"hidden_act", "silu"},
      {"hidden_size", o.hidden_size},
      {"initializer_range", 0.02},
      {"intermediate_size", o.intermediate_size},
      {"max_position_embeddings", o.max_position_embeddings},
      {"num_attention_heads", o.num_heads},
      {"num_hidden_layers", o.num_layers},
      {"num_key_value_heads", o.num_kv_heads},
      {"rms_norm_eps", o.rms_norm_eps},
      {"rope_scaling", nullptr},
      {"rope_theta", o.rope_theta},
      {"sliding_window", nullptr},
      {"tie_word_embeddings", o.tie_word_embeddings},
      {"torch_dtype", "bfloat16"},
      {"use_cache", true},
      {"use_sliding_window", false},
      {"vocab_size", o.vocab_size},
  };
  if (moe) {
    c["decoder_sparse_step"] = o.decoder_sparse_step;
    c["mlp_only_layers"] = o.mlp_only_layers;
    c["moe_intermediate_size"] = o.moe_intermediate_size;
    c["norm_topk_prob"] = o.norm_topk_prob;
    c["num_experts"] = o.num_experts;
    c["num_experts_per_tok"] = o.top_k;
    c["output_router_logits"] = false;
    c["router_aux_loss_coef"] = 0.001;
  }
  return c;
}

bool is_moe_layer(const TinyModelOptions& o, std::int64_t i) {
  if (is_glm(o)) return i >= o.first_k_dense_replace;
  if (o.model_type != "qwen3_moe") return false;
  for (auto m : o.mlp_only_layers)
    if (m == i) return false;
  return o.num_experts > 0 && (i + 1) % o.decoder_sparse_step == 0;
}

}  // namespace

void write_model(const std::string& out_dir, const TinyModelOptions& options, const std::string& tokenizer_dir) {
  TinyModelOptions o = options;
  const bool planted = !o.planted_reply.tokens.empty();
  if (planted) o.tie_word_embeddings = false;  // the planted rows live in an untied lm_head
  if (o.model_type != "qwen3_moe" && o.model_type != "qwen3" && !is_glm(o))
    throw std::runtime_error("write_model: model_type '" + o.model_type + "' (supported: qwen3_moe, qwen3, glm4_moe)");
  if (!is_glm(o)) {  // Qwen3 rotates whole heads and always has q/k norms, no biases
    o.partial_rotary_factor = 1.0;
    o.qk_norm = true;
    o.attention_bias = false;
  }
  if (o.shards < 1) throw std::runtime_error("write_model: shards must be >= 1");
  if (planted) check_planted(o.planted_reply, o.vocab_size);
  const bool switched = !o.planted_switch.tokens.empty();
  if (switched && !planted) throw std::runtime_error("write_model: a planted switch needs a planted reply");
  if (!(o.residual_scale > 0.0 && o.residual_scale <= 1.0))
    throw std::runtime_error("write_model: residual_scale " + std::to_string(o.residual_scale) + " (expected (0, 1])");
  fs::create_directories(out_dir);
  const fs::path dir(out_dir);
  const std::int64_t h = o.hidden_size;
  const std::uint64_t seed = o.seed;
  const double proj_std = 1.0 / std::sqrt(static_cast<double>(h));
  const double rs = o.residual_scale;

  // Tensors grouped by shard: the embedding and final norm go to shard 0, layer i to shard i % N.
  std::vector<std::vector<TensorToWrite>> shards(static_cast<std::size_t>(o.shards));
  shards[0].push_back(random_tensor("model.embed_tokens.weight", {o.vocab_size, h}, 0.0, 0.5, seed));
  shards[0].push_back(random_tensor("model.norm.weight", {h}, 1.0, 0.1, seed));
  if (!o.tie_word_embeddings) {
    shards[0].push_back(random_tensor("lm_head.weight", {o.vocab_size, h}, 0.0, 0.5, seed));
    if (planted) plant_reply(o.planted_reply, shards[0][0], shards[0].back(), h);
  }
  for (std::int64_t i = 0; i < o.num_layers; ++i) {
    auto& out = shards[static_cast<std::size_t>(i % o.shards)];
    const std::string p = "model.layers." + std::to_string(i) + ".";
    const std::int64_t qd = o.num_heads * o.head_dim;
    const std::int64_t kvd = o.num_kv_heads * o.head_dim;
    out.push_back(random_tensor(p + "input_layernorm.weight", {h}, 1.0, 0.1, seed));
    out.push_back(random_tensor(p + "post_attention_layernorm.weight", {h}, 1.0, 0.1, seed));
    out.push_back(random_tensor(p + "self_attn.q_proj.weight", {qd, h}, 0.0, proj_std, seed));
    out.push_back(random_tensor(p + "self_attn.k_proj.weight", {kvd, h}, 0.0, proj_std, seed));
    out.push_back(random_tensor(p + "self_attn.v_proj.weight", {kvd, h}, 0.0, proj_std, seed));
    out.push_back(random_tensor(p + "self_attn.o_proj.weight", {h, qd}, 0.0, rs / std::sqrt(double(qd)), seed));
    if (o.attention_bias) {
      out.push_back(random_tensor(p + "self_attn.q_proj.bias", {qd}, 0.0, 0.2, seed));
      out.push_back(random_tensor(p + "self_attn.k_proj.bias", {kvd}, 0.0, 0.2, seed));
      out.push_back(random_tensor(p + "self_attn.v_proj.bias", {kvd}, 0.0, 0.2, seed));
    }
    if (o.qk_norm) {
      out.push_back(random_tensor(p + "self_attn.q_norm.weight", {o.head_dim}, 1.0, 0.1, seed));
      out.push_back(random_tensor(p + "self_attn.k_norm.weight", {o.head_dim}, 1.0, 0.1, seed));
    }
    if (is_moe_layer(o, i)) {
      const std::int64_t m = o.moe_intermediate_size;
      out.push_back(random_tensor(p + "mlp.gate.weight", {o.num_experts, h}, 0.0, proj_std, seed));
      if (is_glm(o)) {
        // A bias of the order of the sigmoid scores' spread, so that it changes choices.
        out.push_back(random_tensor_f32(p + "mlp.gate.e_score_correction_bias", {o.num_experts}, 0.0, 0.3, seed));
        if (o.n_shared_experts > 0) {
          const std::int64_t sm = m * o.n_shared_experts;
          const std::string q = p + "mlp.shared_experts.";
          out.push_back(random_tensor(q + "gate_proj.weight", {sm, h}, 0.0, proj_std, seed));
          out.push_back(random_tensor(q + "up_proj.weight", {sm, h}, 0.0, proj_std, seed));
          out.push_back(random_tensor(q + "down_proj.weight", {h, sm}, 0.0, rs / std::sqrt(double(sm)), seed));
        }
      }
      for (std::int64_t e = 0; e < o.num_experts; ++e) {
        const std::string q = p + "mlp.experts." + std::to_string(e) + ".";
        out.push_back(random_tensor(q + "gate_proj.weight", {m, h}, 0.0, proj_std, seed));
        out.push_back(random_tensor(q + "up_proj.weight", {m, h}, 0.0, proj_std, seed));
        out.push_back(random_tensor(q + "down_proj.weight", {h, m}, 0.0, rs / std::sqrt(double(m)), seed));
      }
    } else {
      const std::int64_t m = o.intermediate_size;
      out.push_back(random_tensor(p + "mlp.gate_proj.weight", {m, h}, 0.0, proj_std, seed));
      out.push_back(random_tensor(p + "mlp.up_proj.weight", {m, h}, 0.0, proj_std, seed));
      out.push_back(random_tensor(p + "mlp.down_proj.weight", {h, m}, 0.0, rs / std::sqrt(double(m)), seed));
    }
  }
  // glm4_moe's MTP layers sit after the decoder layers (model.layers.{num_layers + j}): a few of
  // their tensors, so that a reader has to recognise and skip them.
  for (std::int64_t j = 0; is_glm(o) && j < o.num_nextn_predict_layers; ++j) {
    const std::string p = "model.layers." + std::to_string(o.num_layers + j) + ".";
    auto& out = shards[static_cast<std::size_t>((o.num_layers + j) % o.shards)];
    out.push_back(random_tensor(p + "eh_proj.weight", {h, 2 * h}, 0.0, proj_std, seed));
    out.push_back(random_tensor(p + "enorm.weight", {h}, 1.0, 0.1, seed));
    out.push_back(random_tensor(p + "hnorm.weight", {h}, 1.0, 0.1, seed));
    out.push_back(random_tensor(p + "shared_head.norm.weight", {h}, 1.0, 0.1, seed));
    out.push_back(random_tensor(p + "input_layernorm.weight", {h}, 1.0, 0.1, seed));
  }
  if (switched) plant_switch(o, o.planted_switch, shards[0]);
  json quantization_config, hf_quant;
  if (o.quantize != WeightFormat::plain) {
    std::vector<std::string> exclude = default_exclusions(o.num_layers);
    exclude.insert(exclude.end(), o.quantize_exclude.begin(), o.quantize_exclude.end());
    for (auto& shard : shards) quantization_config = quantize_linears(shard, o.quantize, exclude, &hf_quant);
  }

  const std::map<std::string, std::string> meta = {{"format", "pt"}};
  if (o.shards == 1) {
    write_safetensors((dir / "model.safetensors").string(), shards[0], meta);
  } else {
    json weight_map = json::object();
    std::uint64_t total = 0;
    for (int s = 0; s < o.shards; ++s) {
      char name[64];
      std::snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", s + 1, o.shards);
      write_safetensors((dir / name).string(), shards[static_cast<std::size_t>(s)], meta);
      for (const auto& t : shards[static_cast<std::size_t>(s)]) {
        weight_map[t.name] = name;
        total += t.data.size();
      }
    }
    json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
    write_text(dir / "model.safetensors.index.json", index.dump(2) + "\n");
  }

  json config = config_json(o);
  if (o.yarn_factor > 0.0)
    config["rope_scaling"] = {{"rope_type", "yarn"},
                              {"factor", o.yarn_factor},
                              {"original_max_position_embeddings", o.yarn_original_max_position_embeddings}};
  if (o.quantize != WeightFormat::plain) config["quantization_config"] = quantization_config;
  write_text(dir / "config.json", config.dump(2) + "\n");
  if (o.quantize == WeightFormat::nvfp4)
    write_text(dir / "hf_quant_config.json", hf_quant.dump(2) + "\n");
  else
    fs::remove(dir / "hf_quant_config.json");  // a model written here before in NVFP4 leaves none behind
  // Qwen3's generation_config.json: <|im_end|> 151645 and <|endoftext|> 151643 both end a turn.
  // GLM-4.5's: <|endoftext|> 151329, <|user|> 151336 and <|observation|> 151338 end a turn.
  const json gen = is_glm(o) ? json{{"eos_token_id", {151329, 151336, 151338}}, {"pad_token_id", 151329}}
                             : json{{"bos_token_id", 151643}, {"do_sample", true},  {"eos_token_id", {151645, 151643}},
                                    {"pad_token_id", 151643}, {"temperature", 0.6}, {"top_k", 20},
                                    {"top_p", 0.95}};
  write_text(dir / "generation_config.json", gen.dump(2) + "\n");
  if (!o.chat_template.empty()) write_text(dir / "chat_template.jinja", o.chat_template);
  if (!tokenizer_dir.empty() && is_glm(o)) {
    write_glm_fixture_tokenizer(out_dir, tokenizer_dir);  // derived from Qwen3's (glm_fixture_tokenizer.hpp)
  } else if (!tokenizer_dir.empty()) {
    copy_file_exact(fs::path(tokenizer_dir) / "tokenizer.json", dir / "tokenizer.json");
    copy_file_exact(fs::path(tokenizer_dir) / "tokenizer_config.json", dir / "tokenizer_config.json");
  }
}

TinyModelOptions tiny_glm_options() {
  TinyModelOptions o;
  o.model_type = "glm4_moe";
  o.num_layers = 3;
  o.partial_rotary_factor = 0.5;
  o.qk_norm = false;
  o.attention_bias = true;
  o.n_shared_experts = 1;
  o.first_k_dense_replace = 1;
  o.num_nextn_predict_layers = 1;
  o.vocab_size = 151552;
  o.rms_norm_eps = 1e-5;
  o.tie_word_embeddings = false;
  return o;
}

void write_tiny_model(const std::string& out_dir, const std::string& tokenizer_dir, std::uint64_t seed,
                      WeightFormat quantize) {
  TinyModelOptions o;
  o.seed = seed;
  o.quantize = quantize;
  write_model(out_dir, o, tokenizer_dir);
}

}  // namespace servedeck::worker
