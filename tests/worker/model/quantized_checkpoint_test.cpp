// Quantised checkpoints: make-tiny-model's FP8 and NVFP4 layouts open with the right formats,
// scale shapes and exclusions; dequantised values are the published formula; and malformed
// checkpoints (wrong or missing scales, bad dtypes, contradicted exclusions, no declaration) are
// refused naming the tensor, what was expected and what it holds.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "tests/worker/model/small_model.hpp"
#include "tests/worker/model/temp_dir.hpp"
#include "worker/model/checkpoint.hpp"
#include "worker/model/safetensors_writer.hpp"
#include "worker/model/tiny_model.hpp"

using namespace servedeck::worker;
using servedeck::test::TempDir;
using json = nlohmann::json;

namespace {

TinyModelOptions small(WeightFormat q, int shards = 1) { return servedeck::test::small_model(q, shards); }

std::vector<TensorToWrite> read_all(const std::string& path) {
  auto f = SafetensorsFile::open(path);
  std::vector<TensorToWrite> out;
  for (const auto& t : f->header().tensors) {
    const auto b = f->bytes(t);
    out.push_back({t.name, t.dtype, t.shape, std::vector<std::byte>(b.begin(), b.end())});
  }
  return out;
}

/// Rewrites dir/model.safetensors through `edit`.
void edit_tensors(const TempDir& dir, const std::function<void(std::vector<TensorToWrite>&)>& edit) {
  auto ts = read_all(dir / "model.safetensors");
  edit(ts);
  write_safetensors(dir / "model.safetensors", ts, {{"format", "pt"}});
}

TensorToWrite& find(std::vector<TensorToWrite>& ts, const std::string& name) {
  for (auto& t : ts)
    if (t.name == name) return t;
  FAIL("no tensor " << name);
  throw std::logic_error("unreachable");
}

void erase(std::vector<TensorToWrite>& ts, const std::string& name) {
  std::erase_if(ts, [&](const TensorToWrite& t) { return t.name == name; });
}

void edit_config(const TempDir& dir, const std::function<void(json&)>& edit) {
  std::ifstream in(dir / "config.json");
  json c = json::parse(in);
  edit(c);
  std::ofstream(dir / "config.json") << c.dump(2);
}

std::string open_error(const TempDir& dir) {
  try {
    Checkpoint::open(dir.path());
  } catch (const std::exception& e) {
    return e.what();
  }
  return "<no error>";
}

float bf16_at(const TensorRef& t, std::size_t i) {
  std::uint16_t b;
  std::memcpy(&b, t.bytes.data() + 2 * i, 2);
  const std::uint32_t u = static_cast<std::uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

double rel_error(const WeightRef& quantised, const WeightRef& original) {
  const auto& q = *quantised.quant;
  std::vector<float> d(static_cast<std::size_t>(q.rows * q.cols));
  dequantize_rows(q, 0, q.rows, d.data());
  double num = 0, den = 0;
  for (std::size_t i = 0; i < d.size(); ++i) {
    const double o = bf16_at(original, i);
    num += (d[i] - o) * (d[i] - o);
    den += o * o;
  }
  return std::sqrt(num / den);
}

}  // namespace

TEST_CASE("fp8 tiny model: every linear but the routers and lm_head is F8_E4M3 with 128x128 block scales") {
  TempDir plain, fp8;
  write_model(plain.path(), small(WeightFormat::plain));
  write_model(fp8.path(), small(WeightFormat::fp8_block));
  const auto cfg = json::parse(std::ifstream(fp8 / "config.json"));
  CHECK(cfg["quantization_config"] == json{{"activation_scheme", "dynamic"},
                                           {"fmt", "e4m3"},
                                           {"quant_method", "fp8"},
                                           {"weight_block_size", {128, 128}},
                                           {"modules_to_not_convert",
                                            {"lm_head", "model.layers.0.mlp.gate", "model.layers.1.mlp.gate",
                                             "model.layers.2.mlp.gate"}}});
  CHECK_FALSE(std::filesystem::exists(fp8 / "hf_quant_config.json"));
  const auto a = Checkpoint::open(plain.path());
  const auto b = Checkpoint::open(fp8.path());
  CHECK(a.quantized_weight_count() == 0);
  CHECK(b.quantization().format == WeightFormat::fp8_block);
  // per layer 4 attention projections; MoE layers 8 experts x 3; the dense layer 3
  CHECK(b.quantized_weight_count() == 3 * 4 + 2 * 8 * 3 + 3);
  const auto& L0 = b.layers()[0];
  CHECK(L0.router.format() == WeightFormat::plain);
  CHECK(L0.router.info->dtype == Dtype::bf16);
  const auto& up = L0.experts[3].up;
  REQUIRE(up.format() == WeightFormat::fp8_block);
  CHECK(up.info->dtype == Dtype::f8_e4m3);
  CHECK(up.quant->scale.info->name == "model.layers.0.mlp.experts.3.up_proj.weight_scale_inv");
  CHECK(up.quant->scale.info->shape == std::vector<std::int64_t>{1, 1});  // 32 x 64 in one partial block
  CHECK(up.quant->stored_bytes() == 32 * 64 + 4);
  CHECK(b.layers()[1].mlp_down.format() == WeightFormat::fp8_block);
  CHECK(b.lm_head().format() == WeightFormat::plain);  // tied: the BF16 embedding
  // The dequantised value is e4m3(q) * scale_inv, and close to the BF16 original.
  std::vector<float> row(64);
  dequantize_rows(*up.quant, 5, 1, row.data());
  const auto* q = reinterpret_cast<const std::uint8_t*>(up.bytes.data());
  float scale_inv;
  std::memcpy(&scale_inv, up.quant->scale.bytes.data(), 4);
  for (int c = 0; c < 64; ++c) CHECK(row[static_cast<std::size_t>(c)] == e4m3_to_f32(q[5 * 64 + c]) * scale_inv);
  const double e = rel_error(up, a.layers()[0].experts[3].up);
  MESSAGE("fp8 expert weight relative error " << e);
  CHECK(e > 0.005);
  CHECK(e < 0.05);
}

TEST_CASE("nvfp4 tiny model: ModelOpt's tensors, hf_quant_config.json, exclusions; values as published") {
  TempDir plain, nv;
  write_model(plain.path(), small(WeightFormat::plain));
  write_model(nv.path(), small(WeightFormat::nvfp4));
  const auto hf = json::parse(std::ifstream(nv / "hf_quant_config.json"));
  CHECK(hf["quantization"]["quant_algo"] == "NVFP4");
  CHECK(hf["quantization"]["group_size"] == 16);
  CHECK(hf["producer"]["name"] == "modelopt");
  const auto cfg = json::parse(std::ifstream(nv / "config.json"));
  CHECK(cfg["quantization_config"]["quant_method"] == "modelopt");
  const auto a = Checkpoint::open(plain.path());
  const auto b = Checkpoint::open(nv.path());
  CHECK(b.quantization().format == WeightFormat::nvfp4);
  CHECK(b.quantized_weight_count() == 3 * 4 + 2 * 8 * 3 + 3);
  const auto& down = b.layers()[2].experts[7].down;  // (64, 32)
  REQUIRE(down.format() == WeightFormat::nvfp4);
  CHECK(down.info->dtype == Dtype::u8);
  CHECK(down.info->shape == std::vector<std::int64_t>{64, 16});
  CHECK(down.quant->scale.info->dtype == Dtype::f8_e4m3);
  CHECK(down.quant->scale.info->shape == std::vector<std::int64_t>{64, 2});
  CHECK(down.quant->stored_bytes() == 64 * 16 + 64 * 2 + 4);
  CHECK(b.layers()[0].router.format() == WeightFormat::plain);
  // the formula: e2m1(nibble) * e4m3(weight_scale) * weight_scale_2, low nibble first
  std::vector<float> row(32);
  dequantize_rows(*down.quant, 9, 1, row.data());
  const auto* q = reinterpret_cast<const std::uint8_t*>(down.bytes.data()) + 9 * 16;
  const auto* s = reinterpret_cast<const std::uint8_t*>(down.quant->scale.bytes.data()) + 9 * 2;
  for (int c = 0; c < 32; ++c) {
    const float want = e2m1_to_f32(c % 2 ? q[c / 2] >> 4 : q[c / 2] & 0xf) * (e4m3_to_f32(s[c / 16]) * down.quant->global_scale);
    CHECK(row[static_cast<std::size_t>(c)] == want);
  }
  const double e = rel_error(down, a.layers()[2].experts[7].down);
  MESSAGE("nvfp4 expert weight relative error " << e);
  CHECK(e > 0.02);
  CHECK(e < 0.2);
}

TEST_CASE("a sharded quantised checkpoint indexes its scales beside their weights") {
  for (auto f : {WeightFormat::fp8_block, WeightFormat::nvfp4}) {
    TempDir dir;
    write_model(dir.path(), small(f, 2));
    const auto idx = json::parse(std::ifstream(dir / "model.safetensors.index.json"));
    const std::string scale = f == WeightFormat::nvfp4 ? "weight_scale_2" : "weight_scale_inv";
    CHECK(idx["weight_map"]["model.layers.1.self_attn.o_proj." + scale] ==
          idx["weight_map"]["model.layers.1.self_attn.o_proj.weight"]);
    CHECK(Checkpoint::open(dir.path()).quantized_weight_count() == 3 * 4 + 2 * 8 * 3 + 3);
  }
}

TEST_CASE("malformed fp8 checkpoints name the tensor, what was expected and what it holds") {
  TempDir dir;
  const std::string m = "model.layers.0.mlp.experts.2.gate_proj";
  auto fresh = [&] { write_model(dir.path(), small(WeightFormat::fp8_block)); };

  fresh();
  edit_tensors(dir, [&](auto& ts) {
    auto& s = find(ts, m + ".weight_scale_inv");
    s.shape = {2, 1};
    s.data.resize(8);
  });
  CHECK(open_error(dir) == dir.path() + ": tensor '" + m + ".weight_scale_inv': expected shape [1, 1] (ceil of [32, 64] / "
                           "weight_block_size [128, 128]), got [2, 1]");
  fresh();
  edit_tensors(dir, [&](auto& ts) { erase(ts, m + ".weight_scale_inv"); });
  CHECK(open_error(dir) == dir.path() + ": missing tensor '" + m + ".weight_scale_inv' (F32, shape [1, 1]: the block scales "
                           "of the F8_E4M3 weight '" + m + ".weight')");
  fresh();
  edit_tensors(dir, [&](auto& ts) {
    auto& s = find(ts, m + ".weight_scale_inv");
    s.dtype = Dtype::f16;
    s.shape = {1, 2};
  });
  CHECK(open_error(dir) == dir.path() + ": tensor '" + m + ".weight_scale_inv': expected dtype F32 or BF16, got F16");
  fresh();
  edit_tensors(dir, [&](auto& ts) {
    auto& w = find(ts, m + ".weight");
    w.shape = {64, 32};
  });
  CHECK(open_error(dir) == dir.path() + ": tensor '" + m + ".weight': expected shape [32, 64] (the linear's (out, in), one "
                           "F8_E4M3 a weight), got [64, 32]");
  // An FP8 norm is not a quantised linear.
  fresh();
  edit_tensors(dir, [&](auto& ts) {
    auto& n = find(ts, "model.norm.weight");
    n.dtype = Dtype::f8_e4m3;
    n.data.resize(64);
  });
  CHECK(open_error(dir) == dir.path() + ": tensor 'model.norm.weight': expected dtype BF16, F16 or F32, got F8_E4M3");
  // An excluded module stored quantised contradicts the declaration.
  fresh();
  edit_config(dir, [&](json& c) { c["quantization_config"]["modules_to_not_convert"].push_back("model.layers.0.mlp.experts"); });
  CHECK(open_error(dir).find("tensor 'model.layers.0.mlp.experts.0.gate_proj.weight' is F8_E4M3 but module "
                             "'model.layers.0.mlp.experts.0.gate_proj' is listed in modules_to_not_convert") != std::string::npos);
  // F8_E4M3 weights with no declaration at all.
  fresh();
  edit_config(dir, [&](json& c) { c.erase("quantization_config"); });
  CHECK(open_error(dir).find("tensor 'model.layers.0.self_attn.q_proj.weight' is F8_E4M3 but the checkpoint declares no "
                             "quantization; a F8_E4M3 weight needs quantization_config.quant_method \"fp8\"") !=
        std::string::npos);
}

TEST_CASE("malformed nvfp4 checkpoints name the tensor, what was expected and what it holds") {
  TempDir dir;
  const std::string m = "model.layers.2.self_attn.v_proj";  // (32, 64)
  auto fresh = [&] { write_model(dir.path(), small(WeightFormat::nvfp4)); };

  fresh();
  edit_tensors(dir, [&](auto& ts) { find(ts, m + ".weight_scale").dtype = Dtype::u8; });
  CHECK(open_error(dir) == dir.path() + ": tensor '" + m + ".weight_scale': expected dtype F8_E4M3, got U8");
  fresh();
  edit_tensors(dir, [&](auto& ts) {
    auto& s = find(ts, m + ".weight_scale");
    s.shape = {32, 2};
    s.data.resize(64);
  });
  CHECK(open_error(dir) == dir.path() + ": tensor '" + m + ".weight_scale': expected shape [32, 4] (one scale per 16 "
                           "inputs), got [32, 2]");
  fresh();
  edit_tensors(dir, [&](auto& ts) { erase(ts, m + ".weight_scale_2"); });
  CHECK(open_error(dir) == dir.path() + ": missing tensor '" + m + ".weight_scale_2' (F32, one element: the per-tensor "
                           "scale of the NVFP4 weight '" + m + ".weight')");
  fresh();
  edit_tensors(dir, [&](auto& ts) {
    auto& g = find(ts, m + ".weight_scale_2");
    g.shape = {2};
    g.data.resize(8);
  });
  CHECK(open_error(dir) == dir.path() + ": tensor '" + m + ".weight_scale_2': expected one F32 element, got shape [2]");
  fresh();
  edit_tensors(dir, [&](auto& ts) {
    const float nan = std::nanf("");
    std::memcpy(find(ts, m + ".weight_scale_2").data.data(), &nan, 4);
  });
  CHECK(open_error(dir) == dir.path() + ": tensor '" + m + ".weight_scale_2' = nan: expected a finite positive scale");
  fresh();
  edit_tensors(dir, [&](auto& ts) {
    auto& w = find(ts, m + ".weight");
    w.shape = {32, 64};
    w.data.resize(32 * 64);
  });
  CHECK(open_error(dir) == dir.path() + ": tensor '" + m + ".weight': expected shape [32, 32] (U8, two e2m1 values a byte "
                           "of [32, 64]), got [32, 64]");
  // U8 weights in a checkpoint that declares FP8
  fresh();
  edit_config(dir, [&](json& c) {
    c["quantization_config"] = {{"quant_method", "fp8"}, {"weight_block_size", {128, 128}}};
  });
  std::filesystem::remove(dir / "hf_quant_config.json");
  CHECK(open_error(dir).find("is U8 but the checkpoint declares fp8 weights") != std::string::npos);
  // exclude_modules contradicted
  fresh();
  edit_config(dir, [&](json& c) { c["quantization_config"]["exclude_modules"].push_back("*self_attn*"); });
  CHECK(open_error(dir).find("is U8 but module 'model.layers.0.self_attn.q_proj' is listed in exclude_modules") !=
        std::string::npos);
}

TEST_CASE("hostile headers stay bounded: a scale shape that would overflow or index past the data is refused") {
  TempDir dir;
  write_model(dir.path(), small(WeightFormat::fp8_block));
  const std::string m = "model.layers.0.self_attn.o_proj";
  // A shape whose byte count does not match the span is refused by the safetensors parser before
  // the checkpoint looks at it; one that matches but lies about the layout by the shape check.
  edit_tensors(dir, [&](auto& ts) {
    auto& s = find(ts, m + ".weight_scale_inv");
    s.shape = {1, 1, 1};
  });
  CHECK(open_error(dir).find("tensor '" + m + ".weight_scale_inv': expected shape [1, 1]") != std::string::npos);
}
