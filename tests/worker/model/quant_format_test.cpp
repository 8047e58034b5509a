// The quantised formats' scalar codecs, the exclusion patterns, and the quantization config as
// published checkpoints declare it (and what this build refuses, with what it read).
#include <doctest/doctest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <string>

#include "worker/model/quant_format.hpp"
#include "worker/model/quantize.hpp"

using namespace servedeck::worker;
using json = nlohmann::json;

namespace {

std::string config_error(const json& config, const json* hf = nullptr) {
  try {
    parse_quantization_config(config, hf, "/m/config.json");
  } catch (const QuantConfigError& e) {
    return e.what();
  }
  return "<no error>";
}

json fp8_config() {
  return {{"quantization_config",
           {{"activation_scheme", "dynamic"},
            {"fmt", "e4m3"},
            {"quant_method", "fp8"},
            {"weight_block_size", {128, 128}},
            {"modules_to_not_convert", {"model.layers.0.mlp.gate", "model.layers.1.mlp.gate"}}}}};
}

}  // namespace

TEST_CASE("e4m3: every finite code round-trips; known values, ties to even, saturation, NaN") {
  for (int b = 0; b < 256; ++b) {
    const auto bits = static_cast<std::uint8_t>(b);
    const float v = e4m3_to_f32(bits);
    if ((b & 0x7f) == 0x7f) {
      CHECK(std::isnan(v));
      continue;
    }
    INFO("code " << b << " = " << v);
    CHECK(f32_to_e4m3(v) == bits);
  }
  CHECK(e4m3_to_f32(0x7e) == 448.0f);
  CHECK(e4m3_to_f32(0x38) == 1.0f);
  CHECK(e4m3_to_f32(0x01) == std::ldexp(1.0f, -9));  // smallest subnormal
  CHECK(e4m3_to_f32(0x08) == std::ldexp(1.0f, -6));  // smallest normal
  CHECK(e4m3_to_f32(0xb8) == -1.0f);
  CHECK(f32_to_e4m3(1.0625f) == 0x38);   // halfway between 1 and 1.125: to the even mantissa (1)
  CHECK(f32_to_e4m3(1.1875f) == 0x3a);   // halfway between 1.125 and 1.25: to 1.25
  CHECK(f32_to_e4m3(1000.0f) == 0x7e);   // saturates at 448
  CHECK(f32_to_e4m3(-1000.0f) == 0xfe);
  CHECK(f32_to_e4m3(std::ldexp(1.0f, -11)) == 0x00);  // a quarter of the smallest subnormal
  CHECK(f32_to_e4m3(std::nanf("")) == 0x7f);
}

TEST_CASE("e2m1: the 16 codes round-trip; ties to even, saturation") {
  const float mags[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  for (std::uint8_t c = 0; c < 16; ++c) {
    CHECK(e2m1_to_f32(c) == (c & 8 ? -mags[c & 7] : mags[c & 7]));
    if (c != 8) CHECK(f32_to_e2m1(e2m1_to_f32(c)) == c);  // -0 encodes as 8, +0 as 0
  }
  CHECK(f32_to_e2m1(0.25f) == 0);  // to 0
  CHECK(f32_to_e2m1(0.75f) == 2);  // to 1.0
  CHECK(f32_to_e2m1(2.5f) == 4);   // to 2.0
  CHECK(f32_to_e2m1(5.0f) == 6);   // to 4.0
  CHECK(f32_to_e2m1(5.1f) == 7);
  CHECK(f32_to_e2m1(100.0f) == 7);
  CHECK(f32_to_e2m1(-3.2f) == (8 | 5));
}

TEST_CASE("exclusion patterns match at path boundaries; globs match the name or a dotted prefix") {
  CHECK(module_matches("lm_head", "lm_head"));
  CHECK(module_matches("model.layers.5.mlp.gate", "model.layers.5.mlp.gate"));
  CHECK_FALSE(module_matches("model.layers.5.mlp.gate_proj", "model.layers.5.mlp.gate"));
  CHECK(module_matches("model.layers.5.mlp.gate", "mlp.gate"));            // a trailing part
  CHECK_FALSE(module_matches("model.layers.5.mlp.experts.1.gate_proj", "mlp.gate"));
  CHECK(module_matches("model.layers.0.self_attn.q_proj", "model.layers.0"));  // a prefix
  CHECK_FALSE(module_matches("model.layers.10.self_attn.q_proj", "model.layers.1"));
  CHECK(module_matches("model.layers.2.self_attn.q_proj", "self_attn"));   // an inner part
  CHECK_FALSE(module_matches("model.layers.2.self_attn.q_proj", "attn"));
  CHECK(module_matches("model.layers.7.mlp.gate", "*mlp.gate"));
  CHECK(module_matches("model.layers.7.mlp.gate", "model.layers.*.mlp.gate"));
  CHECK_FALSE(module_matches("model.layers.7.mlp.gate_proj", "model.layers.*.mlp.gate"));
  CHECK(module_matches("model.layers.0.self_attn.k_proj", "model.layers.0.self_attn*"));
  CHECK(module_matches("model.layers.3.mlp.experts.9.up_proj", "model.layers.3.mlp.experts"));
  CHECK(module_matches("model.layers.3.mlp.experts.9.up_proj", "*.experts"));
  CHECK_FALSE(module_matches("model.layers.3.mlp.gate", ""));
  // Many stars stay fast (the greedy matcher is O(name x pattern) at worst).
  CHECK_FALSE(module_matches(std::string(4000, 'a'), std::string(2000, '*') + "b"));
}

TEST_CASE("fp8: Qwen's quantization_config reads as 128x128 blocks with its exclusions") {
  const auto c = parse_quantization_config(fp8_config(), nullptr, "/m/config.json");
  CHECK(c.format == WeightFormat::fp8_block);
  CHECK(c.block_rows == 128);
  CHECK(c.block_cols == 128);
  CHECK(c.excludes("model.layers.1.mlp.gate"));
  CHECK_FALSE(c.excludes("model.layers.1.mlp.experts.0.gate_proj"));
  CHECK_FALSE(c.excludes("lm_head"));  // only declared modules count (an FP8 lm_head is read as FP8)
  CHECK(c.origin == "/m/config.json quantization_config");
  json ignored = fp8_config();
  ignored["quantization_config"].erase("modules_to_not_convert");
  ignored["quantization_config"]["ignored_layers"] = {"model.layers.3.mlp.gate"};  // vLLM's spelling
  CHECK(parse_quantization_config(ignored, nullptr, "c").excludes("model.layers.3.mlp.gate"));
  CHECK(parse_quantization_config(json{{"model_type", "qwen3"}}, nullptr, "c").format == WeightFormat::plain);
}

TEST_CASE("fp8 configs this build does not read are refused naming the key and the value") {
  json c = fp8_config();
  c["quantization_config"].erase("weight_block_size");
  CHECK(config_error(c).find("/m/config.json quantization_config: quant_method \"fp8\" without 'weight_block_size' "
                             "(per-tensor FP8) is not supported") == 0);
  c = fp8_config();
  c["quantization_config"]["fmt"] = "e5m2";
  CHECK(config_error(c) == "/m/config.json quantization_config: 'fmt' = \"e5m2\": only \"e4m3\" FP8 weights are supported");
  c = fp8_config();
  c["quantization_config"]["weight_block_size"] = {128, 0};
  CHECK(config_error(c) == "/m/config.json quantization_config: 'weight_block_size' = [128,0]: expected each in [1, 1048576]");
  c["quantization_config"]["weight_block_size"] = {128};
  CHECK(config_error(c) == "/m/config.json quantization_config: 'weight_block_size': expected [rows, cols] of integers, got [128]");
  c = fp8_config();
  c["quantization_config"]["modules_to_not_convert"] = {"lm_head", 3};
  CHECK(config_error(c) == "/m/config.json quantization_config: 'modules_to_not_convert': expected module name strings, got number");
  c = fp8_config();
  c["quantization_config"]["modules_to_not_convert"] = {std::string(5000, 'x')};
  CHECK(config_error(c).find("a module name of 5000 bytes exceeds 4096") != std::string::npos);
  c = fp8_config();
  c["quantization_config"] = {{"quant_method", "compressed-tensors"}, {"format", "float-quantized"}};
  CHECK(config_error(c) == "/m/config.json quantization_config: quant_method \"compressed-tensors\" is not supported "
                           "(supported: \"fp8\" with weight_block_size, \"modelopt\" with quant_algo NVFP4)");
  CHECK(config_error(json{{"quantization_config", "fp8"}}) ==
        "/m/config.json quantization_config: expected an object, got string");
}

TEST_CASE("nvfp4: ModelOpt's hf_quant_config.json, config.json's quantization_config, or both") {
  const json hf = {{"producer", {{"name", "modelopt"}, {"version", "0.33.0"}}},
                   {"quantization",
                    {{"quant_algo", "NVFP4"}, {"kv_cache_quant_algo", "FP8"}, {"group_size", 16},
                     {"exclude_modules", {"lm_head", "model.layers.0.mlp.gate"}}}}};
  auto c = parse_quantization_config(json{{"model_type", "qwen3_moe"}}, &hf, "/m/config.json");
  CHECK(c.format == WeightFormat::nvfp4);
  CHECK(c.origin == "/m/hf_quant_config.json");
  CHECK(c.excludes("model.layers.0.mlp.gate"));
  CHECK(c.excluded_key() == "exclude_modules");
  // config.json alone, the algorithm at the top level or nested as in hf_quant_config.json
  const json flat = {{"quantization_config",
                      {{"quant_method", "modelopt"}, {"quant_algo", "NVFP4"}, {"ignore", {"lm_head"}}}}};
  c = parse_quantization_config(flat, nullptr, "/m/config.json");
  CHECK(c.format == WeightFormat::nvfp4);
  CHECK(c.excludes("lm_head"));
  const json nested = {{"quantization_config", {{"quant_method", "modelopt"}, {"quantization", hf["quantization"]}}}};
  CHECK(parse_quantization_config(nested, &hf, "/m/config.json").format == WeightFormat::nvfp4);
  // an FP8 KV cache with unquantised weights
  const json kv_only = {{"quantization", {{"quant_algo", nullptr}, {"kv_cache_quant_algo", "FP8"}}}};
  CHECK(parse_quantization_config(json::object(), &kv_only, "/m/config.json").format == WeightFormat::plain);
}

TEST_CASE("nvfp4 configs this build does not read are refused") {
  json hf = {{"quantization", {{"quant_algo", "NVFP4"}, {"group_size", 32}}}};
  CHECK(config_error(json::object(), &hf) == "/m/hf_quant_config.json: 'group_size' = 32: NVFP4 scales groups of 16 elements");
  hf = {{"quantization", {{"quant_algo", "W4A8_AWQ"}}}};
  CHECK(config_error(json::object(), &hf).find("'quant_algo' = \"W4A8_AWQ\" is not supported") != std::string::npos);
  hf = {{"producer", "modelopt"}};
  CHECK(config_error(json::object(), &hf) == "/m/hf_quant_config.json: expected an object \"quantization\"");
  hf = {{"quantization", {{"quant_algo", "NVFP4"}}}};
  CHECK(config_error(fp8_config(), &hf) ==
        "/m/hf_quant_config.json: declares quant_algo \"NVFP4\" but /m/config.json quantization_config declares "
        "quant_method \"fp8\"");
}

TEST_CASE("quantisers: FP8 blocks and NVFP4 groups reproduce their input within the format's precision") {
  const std::int64_t rows = 130, cols = 160;  // partial FP8 edge blocks in both directions
  std::vector<float> w(static_cast<std::size_t>(rows * cols));
  std::uint64_t s = 1;
  for (auto& x : w) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    x = (static_cast<float>(s >> 40) / 16777216.0f - 0.5f) * 0.2f;
  }
  w[5] = 3.0f;  // an outlier sets one block's scale
  const auto f = quantize_fp8_block(w.data(), rows, cols, 128, 128);
  REQUIRE(f.scale_inv.size() == 4);
  CHECK(f.scale_inv[0] == doctest::Approx(3.0f / 448.0f));
  const auto n = quantize_nvfp4(w.data(), rows, cols);
  REQUIRE(n.weight.size() == static_cast<std::size_t>(rows * cols / 2));
  REQUIRE(n.scale.size() == static_cast<std::size_t>(rows * cols / 16));
  CHECK(n.global_scale == doctest::Approx(3.0f / (6.0f * 448.0f)));
  double e8 = 0, e4 = 0, ref = 0;
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c) {
      const float x = w[static_cast<std::size_t>(r * cols + c)];
      const float d8 = e4m3_to_f32(f.weight[static_cast<std::size_t>(r * cols + c)]) *
                       f.scale_inv[static_cast<std::size_t>((r / 128) * 2 + c / 128)];
      const std::uint8_t byte = n.weight[static_cast<std::size_t>(r * (cols / 2) + c / 2)];
      const float d4 = e2m1_to_f32(c % 2 ? byte >> 4 : byte & 0xf) *
                       e4m3_to_f32(n.scale[static_cast<std::size_t>(r * (cols / 16) + c / 16)]) * n.global_scale;
      e8 += (d8 - x) * (d8 - x);
      e4 += (d4 - x) * (d4 - x);
      ref += x * x;
    }
  // e4m3 keeps 3 mantissa bits (uniform inputs: ~2.5% RMS); e2m1 with a per-16 scale ~10%.
  // The outlier's block (3.0 among values of 0.1) loses most of its small values in FP8.
  CHECK(std::sqrt(e8 / ref) < 0.08);
  CHECK(std::sqrt(e4 / ref) < 0.15);
  CHECK(std::sqrt(e8 / ref) > 0.001);  // it did quantise
}
