// quantize_checkpoint (servedeck-worker quantize): a BF16 checkpoint on disk quantised into the
// published layouts gives, shard by shard, the bytes make-tiny-model --quantize writes for the
// same model; what it refuses is named.
#include <doctest/doctest.h>

#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/worker/model/small_model.hpp"
#include "tests/worker/model/temp_dir.hpp"
#include "worker/model/checkpoint.hpp"
#include "worker/model/checkpoint_quantizer.hpp"
#include "worker/model/safetensors.hpp"
#include "worker/model/safetensors_writer.hpp"
#include "worker/model/tiny_model.hpp"

using namespace servedeck::worker;
using servedeck::test::TempDir;
using json = nlohmann::json;

namespace {

TinyModelOptions model(WeightFormat q, int shards) { return servedeck::test::small_model(q, shards); }

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

TEST_CASE("quantize_checkpoint refuses what it cannot convert, naming it") {
  TempDir plain, q, out;
  write_model(plain.path(), model(WeightFormat::plain, 1));
  write_model(q.path(), model(WeightFormat::nvfp4, 1));
  CHECK(error_of(q.path(), out / "x", WeightFormat::fp8_block).find("already declares a quantization_config") != std::string::npos);
  CHECK(error_of(plain.path(), plain.path(), WeightFormat::nvfp4).find("the output directory is the input") != std::string::npos);
  CHECK(error_of(plain.path(), out / "x", WeightFormat::plain).find("expected format fp8 or nvfp4") != std::string::npos);
  CHECK(error_of(out / "missing", out / "x", WeightFormat::nvfp4).find("is not a directory") != std::string::npos);
  // An output that is not new or empty: an earlier run's files (or links to the input's) would mix in.
  quantize_checkpoint(plain.path(), out / "done", WeightFormat::nvfp4);
  CHECK(error_of(plain.path(), out / "done", WeightFormat::fp8_block).find("is not an empty directory") != std::string::npos);
  std::filesystem::remove(plain / "model.safetensors");
  CHECK(error_of(plain.path(), out / "y", WeightFormat::nvfp4).find("has neither model.safetensors") != std::string::npos);
}

TEST_CASE("quantize_checkpoint on hostile inputs: bounded JSON, shapes, names and counts") {
  TempDir out;
  const auto edit_config = [](const TempDir& dir, const std::function<void(std::string&)>& edit) {
    std::ifstream in(dir / "config.json");
    std::stringstream ss;
    ss << in.rdbuf();
    std::string text = ss.str();
    edit(text);
    std::ofstream(dir / "config.json") << text;
  };
  SUBCASE("a config.json nested 100,000 deep is refused, not written back") {
    TempDir m;
    write_model(m.path(), model(WeightFormat::plain, 1));
    edit_config(m, [](std::string& t) {
      const auto end = t.rfind('}');
      t = t.substr(0, end) + ", \"deep\": " + std::string(100000, '[') + std::string(100000, ']') + "}";
    });
    CHECK(error_of(m.path(), out / "a", WeightFormat::nvfp4).find("nested deeper than") != std::string::npos);
  }
  SUBCASE("num_hidden_layers outside [1, 100000] is named") {
    TempDir m;
    write_model(m.path(), model(WeightFormat::plain, 1));
    edit_config(m, [](std::string& t) {
      const auto at = t.find("\"num_hidden_layers\"");
      const auto comma = t.find(',', at);
      t = t.substr(0, at) + "\"num_hidden_layers\": 100000000" + t.substr(comma);
    });
    const std::string e = error_of(m.path(), out / "b", WeightFormat::nvfp4);
    CHECK(e.find("'num_hidden_layers' = 100000000") != std::string::npos);
  }
  SUBCASE("a scale tensor already beside a BF16 linear would be written twice") {
    TempDir m;
    write_model(m.path(), model(WeightFormat::plain, 1));
    auto f = SafetensorsFile::open(m / "model.safetensors");
    std::vector<TensorToWrite> ts;
    for (const auto& t : f->header().tensors) {
      const auto b = f->bytes(t);
      ts.push_back({t.name, t.dtype, t.shape, std::vector<std::byte>(b.begin(), b.end())});
    }
    f.reset();
    ts.push_back({"model.layers.0.self_attn.q_proj.weight_scale_inv", Dtype::f32, {1, 1}, std::vector<std::byte>(4)});
    write_safetensors(m / "model.safetensors", ts, {{"format", "pt"}});
    CHECK(error_of(m.path(), out / "c", WeightFormat::fp8_block).find("q_proj.weight_scale_inv' would be written twice") != std::string::npos);
  }
  SUBCASE("an empty linear and no linear at all are refused") {
    TempDir m;
    write_model(m.path(), model(WeightFormat::plain, 1));
    std::vector<TensorToWrite> ts{{"model.layers.0.mlp.down_proj.weight", Dtype::bf16, {1099511627776LL, 0}, {}}};
    write_safetensors(m / "model.safetensors", ts, {{"format", "pt"}});
    CHECK(error_of(m.path(), out / "d", WeightFormat::nvfp4).find("is BF16 [1099511627776, 0]: expected a 2-D BF16 weight") != std::string::npos);
    ts = {{"model.norm.weight", Dtype::bf16, {4}, std::vector<std::byte>(8)}};
    write_safetensors(m / "model.safetensors", ts, {{"format", "pt"}});
    CHECK(error_of(m.path(), out / "e", WeightFormat::nvfp4).find("holds no linear weight to quantise") != std::string::npos);
  }
  SUBCASE("a shard not named *.safetensors stays quantised (the copy of other files skips it)") {
    TempDir m;
    write_model(m.path(), model(WeightFormat::plain, 1));
    std::filesystem::rename(m / "model.safetensors", m / "weights.bin");
    json weight_map = json::object();
    auto f = SafetensorsFile::open(m / "weights.bin");
    for (const auto& t : f->header().tensors) weight_map[t.name] = "weights.bin";
    f.reset();
    std::ofstream(m / "model.safetensors.index.json") << json{{"weight_map", weight_map}}.dump();
    quantize_checkpoint(m.path(), out / "f", WeightFormat::nvfp4);
    CHECK(Checkpoint::open(out / "f").quantization().format == WeightFormat::nvfp4);
    auto g = SafetensorsFile::open(out / "f/weights.bin");
    CHECK(g->header().find("model.layers.0.self_attn.q_proj.weight_scale_2") != nullptr);
  }
  SUBCASE("a FIFO as a shard is refused, not waited on") {
    TempDir m;
    write_model(m.path(), model(WeightFormat::plain, 1));
    std::filesystem::remove(m / "model.safetensors");
    REQUIRE(::mkfifo((m / "model.safetensors").c_str(), 0600) == 0);
    CHECK(error_of(m.path(), out / "g", WeightFormat::nvfp4).find("not a regular file") != std::string::npos);
  }
}
