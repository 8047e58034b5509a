// config.json → ModelDescription for glm4_moe (GLM-4.5-Air's and GLM-4.5's published configs),
// YaRN in rope_scaling and rope_parameters, the refusals that name what was read, the checkpoint's
// GLM tensors and skipped MTP layer, and what the CUDA backend refuses.
#include <doctest/doctest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <numbers>
#include <string>

#include "tests/worker/model/temp_dir.hpp"
#include "worker/model/checkpoint.hpp"
#include "worker/model/rope.hpp"
#include "worker/model/tiny_model.hpp"

using namespace servedeck::worker;
using servedeck::test::TempDir;
using json = nlohmann::json;

namespace {

/// GLM-4.5-Air's config.json (zai-org/GLM-4.5-Air, as transformers 4.54 printed it).
json glm45_air_config() {
  return json::parse(R"({
    "architectures": ["Glm4MoeForCausalLM"], "attention_bias": true, "attention_dropout": 0.0,
    "pad_token_id": 151329, "eos_token_id": [151329, 151336, 151338], "head_dim": 128, "hidden_act": "silu",
    "hidden_size": 4096, "partial_rotary_factor": 0.5, "initializer_range": 0.02, "intermediate_size": 10944,
    "max_position_embeddings": 131072, "model_type": "glm4_moe", "moe_intermediate_size": 1408,
    "norm_topk_prob": true, "num_attention_heads": 96, "n_group": 1, "topk_group": 1, "n_routed_experts": 128,
    "n_shared_experts": 1, "routed_scaling_factor": 1.0, "num_experts_per_tok": 8, "first_k_dense_replace": 1,
    "num_hidden_layers": 46, "num_key_value_heads": 8, "rms_norm_eps": 1e-05, "rope_scaling": null,
    "rope_theta": 1000000, "num_nextn_predict_layers": 1, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
    "transformers_version": "4.54.1", "use_cache": true, "use_qk_norm": false, "vocab_size": 151552})");
}

std::string config_error(const json& cfg) {
  try {
    parse_model_config(cfg, "config.json");
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "<no error>";
}

}  // namespace

TEST_CASE("GLM-4.5-Air's config.json: every field that shapes the forward pass") {
  const auto d = parse_model_config(glm45_air_config());
  CHECK(d.model_type == "glm4_moe");
  CHECK(d.num_layers == 46);
  CHECK(d.hidden_size == 4096);
  CHECK(d.num_heads == 96);
  CHECK(d.num_kv_heads == 8);  // GQA groups of 12
  CHECK(d.head_dim == 128);
  CHECK(d.rotary_dim() == 64);
  CHECK(d.rope_theta == 1000000.0);
  CHECK(d.rope_scaling.kind == RopeScalingKind::none);
  CHECK(d.attention_bias);
  CHECK_FALSE(d.qk_norm);
  CHECK(d.rms_norm_eps == 1e-5);
  CHECK(d.intermediate_size == 10944);
  CHECK(d.moe.router == RouterKind::sigmoid_bias_topk);
  CHECK(d.moe.num_experts == 128);
  CHECK(d.moe.top_k == 8);
  CHECK(d.moe.intermediate_size == 1408);
  CHECK(d.moe.shared_experts == 1);
  CHECK(d.moe.shared_intermediate_size == 1408);
  CHECK(d.moe.routed_scaling_factor == 1.0);
  CHECK(d.moe.n_group == 1);
  CHECK(d.moe.topk_group == 1);
  CHECK(d.moe.norm_topk_prob);
  CHECK(d.first_k_dense_replace == 1);
  CHECK(d.num_nextn_predict_layers == 1);
  CHECK(d.layers[0].mlp == MlpKind::dense);
  for (std::size_t i = 1; i < d.layers.size(); ++i) CHECK(d.layers[i].mlp == MlpKind::moe);
  CHECK(d.kv_bytes_per_token_f32() == 46 * 2 * 8 * 128 * 4);
}

TEST_CASE("the benchmark's GLM-4.5-Air config.json is the published one; cut to fewer layers it keeps the dense first layer") {
  const ModelDescription file = load_model_config(std::string(SERVEDECK_SOURCE_DIR) + "/bench/moe_offload/glm-4.5-air/config.json");
  const ModelDescription d = parse_model_config(glm45_air_config());
  CHECK(file.num_layers == d.num_layers);
  CHECK(file.hidden_size == d.hidden_size);
  CHECK(file.num_heads == d.num_heads);
  CHECK(file.moe.intermediate_size == d.moe.intermediate_size);
  CHECK(file.vocab_size == d.vocab_size);
  const ModelDescription cut = model_cut_to_layers(d, 20);
  CHECK(cut.num_layers == 20);
  REQUIRE(cut.layers.size() == 20);
  CHECK(cut.layers[0].mlp == MlpKind::dense);
  CHECK(cut.layers[1].mlp == MlpKind::moe);
  CHECK(cut.layers[19].mlp == MlpKind::moe);
  CHECK(cut.first_k_dense_replace == 1);
  CHECK(model_cut_to_layers(d, 1).layers[0].mlp == MlpKind::dense);
  CHECK_THROWS_AS(model_cut_to_layers(d, 0), std::invalid_argument);
  CHECK_THROWS_AS(model_cut_to_layers(d, 47), std::invalid_argument);
}

TEST_CASE("GLM-4.5's differences: QK-norm, routed_scaling_factor 2.5, three dense layers; class defaults") {
  json cfg = glm45_air_config();
  cfg["hidden_size"] = 5120;
  cfg["intermediate_size"] = 12288;
  cfg["moe_intermediate_size"] = 1536;
  cfg["num_hidden_layers"] = 92;
  cfg["n_routed_experts"] = 160;
  cfg["routed_scaling_factor"] = 2.5;
  cfg["first_k_dense_replace"] = 3;
  cfg["use_qk_norm"] = true;
  const auto d = parse_model_config(cfg);
  CHECK(d.qk_norm);
  CHECK(d.moe.routed_scaling_factor == 2.5);
  CHECK(d.layers[2].mlp == MlpKind::dense);
  CHECK(d.layers[3].mlp == MlpKind::moe);

  // Keys a checkpoint leaves out take Glm4MoeConfig's defaults.
  json bare = glm45_air_config();
  for (const char* k : {"partial_rotary_factor", "n_group", "topk_group", "n_shared_experts", "routed_scaling_factor",
                        "first_k_dense_replace", "norm_topk_prob", "use_qk_norm", "attention_bias", "rms_norm_eps",
                        "num_nextn_predict_layers"})
    bare.erase(k);
  const auto b = parse_model_config(bare);
  CHECK(b.rotary_dim() == 64);
  CHECK(b.moe.n_group == 1);
  CHECK(b.moe.shared_experts == 1);
  CHECK(b.first_k_dense_replace == 1);
  CHECK(b.moe.norm_topk_prob);
  CHECK_FALSE(b.qk_norm);
  CHECK_FALSE(b.attention_bias);
  CHECK(b.rms_norm_eps == 1e-5);
  CHECK(b.num_nextn_predict_layers == 0);

  // transformers 5 writes rope_parameters with the partial factor inside.
  json v5 = glm45_air_config();
  v5.erase("rope_theta");
  v5.erase("partial_rotary_factor");
  v5["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 1000000.0}, {"partial_rotary_factor", 0.25}};
  CHECK(parse_model_config(v5).rotary_dim() == 32);
}

TEST_CASE("glm4_moe refusals name the value read and what is expected") {
  auto with = [](const char* key, json v) {
    json c = glm45_air_config();
    c[key] = std::move(v);
    return config_error(c);
  };
  CHECK(with("n_group", 3) == "config.json: n_routed_experts = 128 is not a multiple of n_group = 3 (model_type glm4_moe)");
  CHECK(with("topk_group", 2) == "config.json: topk_group = 2 exceeds n_group = 1 (model_type glm4_moe)");
  CHECK(with("n_group", 128) ==
        "config.json: n_group = 128 leaves 1 expert per group: a group is scored by its best two (model_type glm4_moe)");
  CHECK(with("num_experts_per_tok", 129) ==
        "config.json: num_experts_per_tok = 129 exceeds the 128 experts of topk_group = 1 groups (model_type glm4_moe)");
  CHECK(with("first_k_dense_replace", 47) ==
        "config.json: first_k_dense_replace = 47 exceeds num_hidden_layers = 46 (model_type glm4_moe)");
  CHECK(with("scoring_func", "softmax") ==
        "config.json: 'scoring_func' = \"softmax\": glm4_moe routes with \"sigmoid\" (model_type glm4_moe)");
  CHECK(with("partial_rotary_factor", 0.001) ==
        "config.json: partial_rotary_factor = 0.001000 rotates 0 of head_dim 128 dimensions: expected an even number >= 2 "
        "(model_type glm4_moe)");
  CHECK(with("routed_scaling_factor", 0) == "config.json: routed_scaling_factor = 0.000000: expected > 0 (model_type glm4_moe)");
  json qwen = glm45_air_config();
  qwen["model_type"] = "qwen3_moe";
  qwen["num_experts"] = 128;
  CHECK(config_error(qwen) ==
        "config.json: partial_rotary_factor = 0.500000: Qwen3 rotates the whole head (expected 1.0) (model_type qwen3_moe)");
}

TEST_CASE("YaRN: rope_scaling (type or rope_type) and rope_parameters read alike; defaults as transformers") {
  json cfg = glm45_air_config();
  cfg["model_type"] = "qwen3_moe";
  cfg.erase("partial_rotary_factor");
  cfg["num_experts"] = 128;
  cfg["attention_bias"] = false;
  cfg["rope_scaling"] = {{"type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 32768}};
  auto d = parse_model_config(cfg);
  CHECK(d.rope_scaling.kind == RopeScalingKind::yarn);
  CHECK(d.rope_scaling.factor == 4.0);
  CHECK(d.rope_scaling.original_max_position_embeddings == 32768);
  CHECK(d.rope_scaling.beta_fast == 32.0);
  CHECK(d.rope_scaling.beta_slow == 1.0);
  CHECK(d.rope_scaling.attention_factor == doctest::Approx(0.1 * std::log(4.0) + 1.0));
  CHECK(d.rope_scaling.truncate);

  cfg.erase("rope_scaling");
  cfg.erase("rope_theta");
  cfg["rope_parameters"] = {{"rope_type", "yarn"}, {"rope_theta", 1e6}, {"factor", 2.0}, {"beta_fast", 16},
                            {"mscale", 1.0}, {"mscale_all_dim", 0.5}, {"truncate", false}};
  d = parse_model_config(cfg);
  CHECK(d.rope_scaling.original_max_position_embeddings == 131072);  // absent: max_position_embeddings
  CHECK(d.rope_scaling.beta_fast == 16.0);
  CHECK_FALSE(d.rope_scaling.truncate);
  CHECK(d.rope_scaling.attention_factor == doctest::Approx((0.1 * std::log(2.0) + 1.0) / (0.05 * std::log(2.0) + 1.0)));
  cfg["rope_parameters"]["attention_factor"] = 1.5;
  CHECK(parse_model_config(cfg).rope_scaling.attention_factor == 1.5);
  cfg["rope_parameters"]["factor"] = -1;
  CHECK(config_error(cfg) == "config.json: 'rope_parameters'.factor = -1.000000: expected > 0 (model_type qwen3_moe)");
}

TEST_CASE("rope_inv_freq: plain RoPE, and YaRN's blend between extrapolated and interpolated frequencies") {
  const std::int64_t dim = 64;
  const double theta = 1e6;
  const auto plain = rope_inv_freq(theta, dim, RopeScaling{});
  REQUIRE(plain.size() == 32);
  CHECK(plain[0] == 1.0f);
  CHECK(plain[5] == doctest::Approx(std::pow(theta, -10.0 / 64)).epsilon(1e-6));

  RopeScaling y;
  y.kind = RopeScalingKind::yarn;
  y.factor = 4.0;
  y.original_max_position_embeddings = 32768;
  const auto yarn = rope_inv_freq(theta, dim, y);
  REQUIRE(yarn.size() == 32);
  // low = floor(64 ln(32768 / (2 pi 32)) / (2 ln 1e6)) = 11, high = ceil(... / (2 pi 1)) = 20.
  auto corr = [&](double rot) { return 64.0 * std::log(32768.0 / (rot * 2 * std::numbers::pi)) / (2 * std::log(theta)); };
  REQUIRE(std::floor(corr(32)) == 11);
  REQUIRE(std::ceil(corr(1)) == 20);
  for (std::size_t i = 0; i <= 11; ++i) CHECK(yarn[i] == plain[i]);                   // high frequencies: kept
  for (std::size_t i = 20; i < 32; ++i) CHECK(yarn[i] == doctest::Approx(plain[i] / 4.0f).epsilon(1e-6));  // slow: / factor
  for (std::size_t i = 12; i < 20; ++i) {                                             // the ramp between
    CHECK(yarn[i] < plain[i]);
    CHECK(yarn[i] > plain[i] / 4.0f);
  }
}

TEST_CASE("the tiny GLM checkpoint: GLM tensors resolved, the MTP layer's tensors counted and left unread") {
  TempDir dir;
  TinyModelOptions o = tiny_glm_options();
  o.vocab_size = 512;
  write_model(dir.path(), o);
  const auto ck = Checkpoint::open(dir.path());
  const auto& d = ck.description();
  CHECK(d.model_type == "glm4_moe");
  CHECK(ck.skipped_mtp_tensors() == 5);
  REQUIRE(ck.layers().size() == 3);
  CHECK(ck.layers()[0].mlp_gate.info != nullptr);
  CHECK(ck.layers()[0].router.info == nullptr);
  const auto& moe = ck.layers()[1];
  CHECK(moe.router_bias.info->dtype == Dtype::f32);
  CHECK(moe.router_bias.info->shape == std::vector<std::int64_t>{8});
  CHECK(moe.shared.down.info->shape == std::vector<std::int64_t>{64, 32});
  CHECK(moe.q_bias.info->shape == std::vector<std::int64_t>{64});
  CHECK(moe.q_norm.info == nullptr);
}

TEST_CASE("the CUDA backend runs glm4_moe and YaRN; it refuses shapes past its kernels, named") {
  CHECK(cuda_backend_unsupported(parse_model_config(glm45_air_config())).empty());
  json q = glm45_air_config();
  q["model_type"] = "qwen3_moe";
  q.erase("partial_rotary_factor");
  q["attention_bias"] = false;
  q["num_experts"] = 128;
  CHECK(cuda_backend_unsupported(parse_model_config(q)).empty());
  q["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 32768}};
  CHECK(cuda_backend_unsupported(parse_model_config(q)).empty());
  json g = glm45_air_config();
  g["n_routed_experts"] = 256;
  g["n_group"] = 128;
  g["topk_group"] = 4;
  CHECK(cuda_backend_unsupported(parse_model_config(g)) ==
        "the CUDA backend does not run n_group 128 (the sigmoid router takes at most 64 groups); use --backend cpu");
  json h = glm45_air_config();
  h["num_key_value_heads"] = 4;  // 96 / 4 = 24
  CHECK(cuda_backend_unsupported(parse_model_config(h)) ==
        "the CUDA backend does not run a GQA group of 24 query heads per KV head (at most 16); use --backend cpu");
}
