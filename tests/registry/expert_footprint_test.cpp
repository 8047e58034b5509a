// The routed experts' bytes a checkpoint declares, per format, on the Qwen3-30B-A3B shape and on
// glm4_moe's layout; malformed configs give an error naming the key, never an exception.
#include <doctest/doctest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "registry/expert_footprint.hpp"
#include "tests/worker/model/temp_dir.hpp"

using namespace servedeck::registry;
using servedeck::test::TempDir;
using json = nlohmann::json;

namespace {

json qwen3_30b() {
  std::ifstream in(std::string(SERVEDECK_SOURCE_DIR) + "/bench/moe_offload/qwen3-30b-a3b/config.json");
  return json::parse(in);
}

void write(const TempDir& dir, const json& config, const json* hf = nullptr) {
  std::ofstream(dir / "config.json") << config.dump();
  if (hf) std::ofstream(dir / "hf_quant_config.json") << hf->dump();
}

}  // namespace

TEST_CASE("Qwen3-30B-A3B: 48 x 128 experts of 9 MiB in BF16, about half in FP8 and 0.28 in NVFP4") {
  TempDir dir;
  json cfg = qwen3_30b();
  write(dir, cfg);
  auto f = discover_expert_footprint(dir.path());
  REQUIRE(f.found);
  CHECK(f.error.empty());
  CHECK(f.format == "bf16");
  CHECK(f.moe_layers == 48);
  CHECK(f.experts == 128);
  CHECK(f.bytes_per_expert == 3ull * 768 * 2048 * 2);
  CHECK(f.expert_bytes() == 57982058496ull);
  CHECK(f.hot_cache_bytes(32) == 48ull * 32 * 9437184);
  // embed + lm_head (untied) + 48 x (q, k, v, o) + 48 routers, bf16
  CHECK(f.resident_bytes == 2ull * (151936ull * 2048 * 2 + 48ull * 2048 * (2 * 32 * 128 + 2 * 4 * 128) + 48ull * 128 * 2048));

  cfg["quantization_config"] = {{"quant_method", "fp8"}, {"fmt", "e4m3"}, {"weight_block_size", {128, 128}},
                                {"modules_to_not_convert", {"lm_head", "model.layers.0.mlp.gate"}}};
  write(dir, cfg);
  f = discover_expert_footprint(dir.path());
  CHECK(f.format == "fp8");
  // weights 3 x 768 x 2048 bytes; scales 4 x (2 x 6 x 16 + 16 x 6)
  CHECK(f.bytes_per_expert == 4718592ull + 1152);
  CHECK(f.expert_bytes() == 28998107136ull);

  cfg.erase("quantization_config");
  const json hf = {{"quantization", {{"quant_algo", "NVFP4"}, {"group_size", 16}, {"exclude_modules", {"lm_head"}}}}};
  write(dir, cfg, &hf);
  f = discover_expert_footprint(dir.path());
  CHECK(f.format == "nvfp4");
  CHECK(f.bytes_per_expert == 3ull * (768 * 2048 / 2 + 768 * 2048 / 16 + 4));
  // An exclusion that names the experts keeps them BF16.
  const json hf_experts = {{"quantization", {{"quant_algo", "NVFP4"}, {"exclude_modules", {"*mlp.experts*"}}}}};
  write(dir, cfg, &hf_experts);
  CHECK(discover_expert_footprint(dir.path()).format == "bf16");
}

TEST_CASE("glm4_moe's layout: n_routed_experts and first_k_dense_replace") {
  TempDir dir;
  write(dir, json{{"model_type", "glm4_moe"}, {"num_hidden_layers", 46}, {"hidden_size", 4096},
                  {"moe_intermediate_size", 1408}, {"n_routed_experts", 128}, {"first_k_dense_replace", 1},
                  {"intermediate_size", 10944}, {"num_attention_heads", 96}, {"num_key_value_heads", 8},
                  {"head_dim", 128}, {"vocab_size", 151552}});
  const auto f = discover_expert_footprint(dir.path());
  REQUIRE(f.found);
  CHECK(f.moe_layers == 45);
  CHECK(f.experts == 128);
  CHECK(f.bytes_per_expert == 3ull * 1408 * 4096 * 2);
}

TEST_CASE("no config, no experts, or a mistyped one: not found, with the error named") {
  TempDir dir;
  CHECK_FALSE(discover_expert_footprint(dir.path()).found);
  CHECK_FALSE(discover_expert_footprint("").found);
  write(dir, json{{"model_type", "qwen3"}, {"num_hidden_layers", 2}, {"hidden_size", 64}});
  auto f = discover_expert_footprint(dir.path());
  CHECK_FALSE(f.found);
  CHECK(f.error.empty());
  json cfg = qwen3_30b();
  cfg["moe_intermediate_size"] = "768";
  write(dir, cfg);
  f = discover_expert_footprint(dir.path());
  CHECK_FALSE(f.found);
  CHECK(f.error == dir / "config.json" + ": 'moe_intermediate_size' = \"768\" is not an integer in [1, 16777216]");
  cfg = qwen3_30b();
  cfg["quantization_config"] = {{"quant_method", 7}};  // mistyped: read as no quantisation, never a throw
  write(dir, cfg);
  CHECK(discover_expert_footprint(dir.path()).format == "bf16");
  std::ofstream(dir / "config.json") << "{\"num_experts\": [";
  f = discover_expert_footprint(dir.path());
  CHECK_FALSE(f.found);
  CHECK(f.error.find("config.json: not a JSON object") != std::string::npos);
}
