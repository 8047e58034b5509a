// The CPU backend over quantised checkpoints: it dequantises at load and then runs the same fp32
// forward pass — bit for bit the pass over a plain F32 checkpoint holding the dequantised values —
// and the quantisation error against the BF16 original is measured and bounded.
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/worker/cpu/pool_support.hpp"
#include "tests/worker/model/temp_dir.hpp"
#include "worker/cpu/cpu_backend.hpp"
#include "worker/cpu/dequantized_weights.hpp"
#include "worker/cpu/logit_compare.hpp"
#include "worker/cpu/ops.hpp"
#include "worker/model/checkpoint.hpp"
#include "worker/model/safetensors_writer.hpp"
#include "worker/model/tiny_model.hpp"

using namespace servedeck::worker;
using servedeck::test::TempDir;
using json = nlohmann::json;

namespace {

TinyModelOptions options(WeightFormat q) {
  TinyModelOptions o;
  o.vocab_size = 512;
  o.num_layers = 3;
  o.mlp_only_layers = {1};
  o.quantize = q;
  return o;
}

std::vector<int32_t> prompt(std::size_t n) {
  std::vector<int32_t> t(n);
  for (std::size_t i = 0; i < n; ++i) t[i] = static_cast<int32_t>((i * 37 + 11) % 512);
  return t;
}

std::vector<float> logits(const Checkpoint& ck, const std::vector<int32_t>& tokens) {
  auto be = make_cpu_backend(ck, {2, KvDtype::f32});
  testing::Pool pool(*be, tokens.size());
  KvSequence seq(pool.blocks, false);
  return forward_sequence(*be, seq, tokens, true);
}

TensorToWrite copy_of(const TensorRef& t) {
  return {t.info->name, t.info->dtype, t.info->shape, std::vector<std::byte>(t.bytes.begin(), t.bytes.end())};
}

/// Writes the dequantised weights of `ck` as a plain checkpoint (F32 where dequantised).
void write_dequantized(const Checkpoint& ck, const std::string& from, const std::string& to) {
  cpu::DequantizedWeights dw(ck, 2);
  std::vector<TensorToWrite> ts{copy_of(ck.embed_tokens()), copy_of(ck.final_norm())};
  for (std::size_t i = 0; i < dw.layers().size(); ++i) {
    LayerWeights L = dw.layers()[i];
    for (const TensorRef* t : {&L.input_norm, &L.post_attn_norm, &L.q_norm, &L.k_norm}) ts.push_back(copy_of(*t));
    for_each_linear(L, [&](WeightRef& w) {
      CHECK(w.quant == nullptr);
      ts.push_back(copy_of(w));
    });
  }
  std::filesystem::create_directories(to);
  write_safetensors(to + "/model.safetensors", ts);
  json cfg = json::parse(std::ifstream(from + "/config.json"));
  cfg.erase("quantization_config");
  std::ofstream(to + "/config.json") << cfg.dump();
  std::filesystem::copy_file(from + "/generation_config.json", to + "/generation_config.json");
}

}  // namespace

TEST_CASE("quantised checkpoints: the forward pass is the plain one over the dequantised weights, bit for bit") {
  for (auto f : {WeightFormat::fp8_block, WeightFormat::nvfp4}) {
    INFO(to_string(f));
    TempDir q, d;
    write_model(q.path(), options(f));
    const auto ck = Checkpoint::open(q.path());
    write_dequantized(ck, q.path(), d / "plain");
    const auto plain = Checkpoint::open(d / "plain");
    CHECK(plain.quantized_weight_count() == 0);
    CHECK(plain.layers()[0].experts[0].gate.info->dtype == Dtype::f32);
    const auto tokens = prompt(24);
    const auto a = logits(ck, tokens);
    const auto b = logits(plain, tokens);
    REQUIRE(a.size() == b.size());
    CHECK(a == b);
    cpu::DequantizedWeights dw(ck, 1);
    CHECK(dw.dequantized_count() == ck.quantized_weight_count());
  }
}

TEST_CASE("quantisation error against the BF16 original: measured, bounded, and not zero") {
  TempDir plain_dir;
  write_model(plain_dir.path(), options(WeightFormat::plain));
  const auto plain = Checkpoint::open(plain_dir.path());
  const auto tokens = prompt(48);
  const auto ref = logits(plain, tokens);
  // note: measured on this model (seed 0, 48 tokens); random weights amplify weight error
  // through routing and attention more than trained ones. Bounds leave ~2x headroom.
  struct Case {
    WeightFormat f;
    double max_rel_l2, min_top1;
  };
  for (const Case c : {Case{WeightFormat::fp8_block, 0.30, 0.75}, Case{WeightFormat::nvfp4, 0.60, 0.50}}) {
    TempDir dir;
    write_model(dir.path(), options(c.f));
    const auto got = logits(Checkpoint::open(dir.path()), tokens);
    const auto cmp = cpu::compare_logits(ref, got, 512);
    MESSAGE(to_string(c.f) << ": logits rel_l2 " << cmp.rel_l2 << ", top-1 agreement " << cmp.top1_agreement
                           << ", mean KL " << cmp.mean_kl << " nats over " << cmp.positions << " positions");
    CHECK(cmp.positions == 48);
    CHECK(cmp.rel_l2 > 1e-3);
    CHECK(cmp.rel_l2 < c.max_rel_l2);
    CHECK(cmp.top1_agreement >= c.min_top1);
  }
}

TEST_CASE("a quantised tensor read as plain numbers is a logic error, not garbage") {
  TempDir dir;
  write_model(dir.path(), options(WeightFormat::fp8_block));
  const auto ck = Checkpoint::open(dir.path());
  std::vector<float> out(4);
  CHECK_THROWS_WITH_AS(cpu::to_f32(ck.layers()[0].q_proj, 0, 4, out.data()),
                       "tensor 'model.layers.0.self_attn.q_proj.weight' is stored as F8_E4M3 (quantised); it must be "
                       "dequantised before it is read as plain numbers",
                       std::logic_error);
}

TEST_CASE("logit comparison: identical rows agree exactly; a flipped argmax and a shifted row are counted") {
  const std::vector<float> a{1, 2, 3, 0, 5, 1};
  CHECK(cpu::compare_logits(a, a, 3).rel_l2 == 0);
  CHECK(cpu::compare_logits(a, a, 3).mean_kl == doctest::Approx(0).epsilon(1e-12));
  const std::vector<float> b{1, 4, 3, 1, 6, 2};  // row 0's argmax moves; row 1 shifts by a constant
  const auto c = cpu::compare_logits(a, b, 3);
  CHECK(c.positions == 2);
  CHECK(c.top1_agreement == 0.5);
  CHECK(c.max_abs == 2);
  CHECK(c.mean_kl > 0);
}
