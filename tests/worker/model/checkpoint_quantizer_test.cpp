// quantize_checkpoint (servedeck-worker quantize): a BF16 checkpoint on disk quantised into the
// published layouts gives, shard by shard, the bytes make-tiny-model --quantize writes for the
// same model; what it refuses is named.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/worker/model/temp_dir.hpp"
#include "worker/model/checkpoint.hpp"
#include "worker/model/checkpoint_quantizer.hpp"
#include "worker/model/safetensors.hpp"
#include "worker/model/tiny_model.hpp"

using namespace servedeck::worker;
using servedeck::test::TempDir;
using json = nlohmann::json;

namespace {

TinyModelOptions model(WeightFormat q, int shards) {
  TinyModelOptions o;
  o.vocab_size = 512;
  o.num_layers = 3;
  o.mlp_only_layers = {1};  // a dense layer: its gate/up/down are quantised too
  o.shards = shards;
  o.quantize = q;
  return o;
}

json read_json(const std::string& path) {
  std::ifstream in(path);
  REQUIRE(in.good());
  return json::parse(in);
}

/// Every tensor of `a` equals `b`'s of the same name (dtype, shape, bytes), and the names agree.
void check_same_tensors(const std::string& a, const std::string& b) {
  auto fa = SafetensorsFile::open(a);
  auto fb = SafetensorsFile::open(b);
  REQUIRE(fa->header().tensors.size() == fb->header().tensors.size());
  for (const TensorInfo& t : fa->header().tensors) {
    CAPTURE(t.name);
    const TensorInfo* u = fb->header().find(t.name);
    REQUIRE(u != nullptr);
    CHECK(u->dtype == t.dtype);
    CHECK(u->shape == t.shape);
    const auto x = fa->bytes(t), y = fb->bytes(*u);
    CHECK(std::equal(x.begin(), x.end(), y.begin(), y.end()));
  }
}

std::string error_of(const std::string& in, const std::string& out, WeightFormat f) {
  try {
    quantize_checkpoint(in, out, f);
  } catch (const std::exception& e) {
    return e.what();
  }
  return "<no error>";
}

}  // namespace

TEST_CASE("quantize_checkpoint gives make-tiny-model --quantize's bytes, shard by shard") {
  for (const WeightFormat f : {WeightFormat::fp8_block, WeightFormat::nvfp4}) {
    for (const int shards : {1, 2}) {
      CAPTURE(to_string(f));
      CAPTURE(shards);
      TempDir plain, want, got;
      write_model(plain.path(), model(WeightFormat::plain, shards));
      write_model(want.path(), model(f, shards));
      const QuantizeSummary s = quantize_checkpoint(plain.path(), got / "out", f);
      CHECK(s.shards == shards);
      CHECK(s.bytes_out < s.bytes_in);
      std::vector<std::string> files;
      for (const auto& e : std::filesystem::directory_iterator(want.path()))
        if (e.path().extension() == ".safetensors") files.push_back(e.path().filename().string());
      REQUIRE(files.size() == static_cast<std::size_t>(shards));
      for (const auto& file : files) check_same_tensors(want / file, got / ("out/" + file));
      CHECK(read_json(got / "out/config.json") == read_json(want / "config.json"));
      if (shards > 1) CHECK(read_json(got / "out/model.safetensors.index.json")["weight_map"] == read_json(want / "model.safetensors.index.json")["weight_map"]);
      CHECK(std::filesystem::exists(got / "out/hf_quant_config.json") == (f == WeightFormat::nvfp4));
      CHECK(std::filesystem::exists(got / "out/generation_config.json"));
      // 3 layers: attention q, k, v, o each; two MoE layers, gate/up/down of each expert; one dense MLP.
      const Checkpoint ck = Checkpoint::open(got / "out");
      CHECK(ck.quantization().format == f);
      CHECK(s.linears_quantized == 3 * 4 + 2 * model(f, 1).num_experts * 3 + 3);
    }
  }
}

TEST_CASE("quantize_checkpoint into a directory a run of another format wrote leaves none of its files behind") {
  TempDir plain, out;
  write_model(plain.path(), model(WeightFormat::plain, 2));
  quantize_checkpoint(plain.path(), out / "q", WeightFormat::nvfp4);
  REQUIRE(std::filesystem::exists(out / "q/hf_quant_config.json"));
  TempDir single;
  write_model(single.path(), model(WeightFormat::plain, 1));
  quantize_checkpoint(single.path(), out / "q", WeightFormat::fp8_block);
  CHECK_FALSE(std::filesystem::exists(out / "q/hf_quant_config.json"));
  CHECK_FALSE(std::filesystem::exists(out / "q/model.safetensors.index.json"));
  CHECK(Checkpoint::open(out / "q").quantization().format == WeightFormat::fp8_block);
}

TEST_CASE("quantize_checkpoint refuses what it cannot convert, naming it") {
  TempDir plain, q, out;
  write_model(plain.path(), model(WeightFormat::plain, 1));
  write_model(q.path(), model(WeightFormat::nvfp4, 1));
  CHECK(error_of(q.path(), out / "x", WeightFormat::fp8_block).find("already declares a quantization_config") != std::string::npos);
  CHECK(error_of(plain.path(), plain.path(), WeightFormat::nvfp4).find("the output directory is the input") != std::string::npos);
  CHECK(error_of(plain.path(), out / "x", WeightFormat::plain).find("expected format fp8 or nvfp4") != std::string::npos);
  CHECK(error_of(out / "missing", out / "x", WeightFormat::nvfp4).find("is not a directory") != std::string::npos);
  std::filesystem::remove(plain / "model.safetensors");
  CHECK(error_of(plain.path(), out / "y", WeightFormat::nvfp4).find("has neither model.safetensors") != std::string::npos);
}
