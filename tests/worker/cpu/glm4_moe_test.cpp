// glm4_moe on the CPU backend beyond the transformers comparison (transformers_equivalence_test):
// the KV cache (one token at a time = the whole prompt) with partial rotary and q/k/v biases,
// the router's correction bias and group limit changing what is computed, the shared expert
// taking part, and the MTP layer's tensors left unread.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <vector>

#include "tests/worker/cpu/pool_support.hpp"
#include "tests/worker/model/temp_dir.hpp"
#include "worker/cpu/cpu_backend.hpp"
#include "worker/model/checkpoint.hpp"
#include "worker/model/safetensors_writer.hpp"
#include "worker/model/tiny_model.hpp"

using namespace servedeck::worker;
using servedeck::test::TempDir;

namespace {

TinyModelOptions glm_options() {
  TinyModelOptions o = tiny_glm_options();
  o.vocab_size = 512;
  o.num_experts = 8;
  o.top_k = 2;
  o.n_group = 4;
  o.topk_group = 2;
  o.qk_norm = true;
  o.routed_scaling_factor = 2.5;
  return o;
}

std::vector<int32_t> prompt(std::size_t n) {
  std::vector<int32_t> t(n);
  for (std::size_t i = 0; i < n; ++i) t[i] = static_cast<int32_t>((i * 53 + 7) % 512);
  return t;
}

float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  float m = 0;
  for (std::size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

std::vector<float> logits_of(const std::string& dir, const std::vector<int32_t>& toks) {
  const auto ck = Checkpoint::open(dir);
  auto be = make_cpu_backend(ck, {2, KvDtype::f32});
  testing::Pool pool(*be, toks.size());
  KvSequence seq(pool.blocks, false);
  return forward_sequence(*be, seq, toks, true);
}

/// Overwrites every element of tensor `name` in `dir`/model.safetensors with `value` (its dtype).
void set_tensor(const std::string& dir, const std::string& name, float value) {
  std::vector<TensorToWrite> all;
  {
  const auto ck = Checkpoint::open(dir);  // copied out, then unmapped before the file is rewritten
  for (const auto& n : ck.tensors().names()) {
    const TensorRef t = ck.tensors().find(n);
    TensorToWrite w{n, t.info->dtype, t.info->shape, {}};
    w.data.assign(t.bytes.begin(), t.bytes.end());
    if (n == name) {
      REQUIRE(t.info->dtype == Dtype::f32);
      for (std::size_t i = 0; i < t.info->element_count(); ++i) std::memcpy(w.data.data() + 4 * i, &value, 4);
    }
    all.push_back(std::move(w));
  }
  }
  write_safetensors(dir + "/model.safetensors", all, {{"format", "pt"}});
}

}  // namespace

TEST_CASE("glm4_moe: one token at a time through the KV cache = the whole prompt") {
  TempDir dir;
  write_model(dir.path(), glm_options());
  const auto ck = Checkpoint::open(dir.path());
  CHECK(ck.description().rotary_dim() == 8);
  CHECK(ck.skipped_mtp_tensors() == 5);
  auto be = make_cpu_backend(ck, {2, KvDtype::f32});
  const std::size_t v = be->vocab_size();
  const auto toks = prompt(40);
  testing::Pool pool(*be, 2 * toks.size() + 32);  // two sequences, each up to a block of slack
  KvSequence whole(pool.blocks, false), inc(pool.blocks, false);
  const auto full = forward_sequence(*be, whole, toks, true);
  float worst = 0;
  for (std::size_t i = 0; i < toks.size(); ++i) {
    const auto row = forward_sequence(*be, inc, std::span<const int32_t>(toks).subspan(i, 1), false);
    REQUIRE(row.size() == v);
    for (std::size_t j = 0; j < v; ++j) worst = std::max(worst, std::fabs(row[j] - full[i * v + j]));
  }
  CHECK(worst <= 1e-4f);
}

TEST_CASE("glm4_moe: the correction bias, the group limit and the shared expert each change the logits") {
  const auto toks = prompt(24);
  TempDir base;
  write_model(base.path(), glm_options());
  const auto ref = logits_of(base.path(), toks);

  // Zeroing layer 1's correction bias changes which experts its tokens choose.
  TempDir biased;
  write_model(biased.path(), glm_options());
  set_tensor(biased.path(), "model.layers.1.mlp.gate.e_score_correction_bias", 0.0f);
  const auto zero_bias = logits_of(biased.path(), toks);
  CHECK(max_abs_diff(ref, zero_bias) > 1e-2f);

  // All groups allowed: other experts become reachable.
  TinyModelOptions all_groups = glm_options();
  all_groups.topk_group = all_groups.n_group;
  TempDir open;
  write_model(open.path(), all_groups);
  CHECK(max_abs_diff(ref, logits_of(open.path(), toks)) > 1e-2f);

  // Without the shared expert (same routed weights otherwise).
  TinyModelOptions no_shared = glm_options();
  no_shared.n_shared_experts = 0;
  TempDir ns;
  write_model(ns.path(), no_shared);
  CHECK(max_abs_diff(ref, logits_of(ns.path(), toks)) > 1e-2f);
}

TEST_CASE("glm4_moe: a checkpoint without a declared tensor is refused by name; MTP tensors are not needed") {
  TempDir dir;
  TinyModelOptions o = glm_options();
  o.num_nextn_predict_layers = 0;  // the config declares none, the tensors are absent: fine
  write_model(dir.path(), o);
  CHECK_NOTHROW(Checkpoint::open(dir.path()));
  TinyModelOptions nobias = glm_options();
  nobias.attention_bias = false;  // tensors without biases ...
  TempDir d2;
  write_model(d2.path(), nobias);
  // ... under a config that declares them.
  std::ifstream in(d2 / "config.json");
  auto cfg = nlohmann::json::parse(in);
  cfg["attention_bias"] = true;
  std::ofstream(d2 / "config.json") << cfg.dump(2);
  try {
    Checkpoint::open(d2.path());
    FAIL("expected a CheckpointError");
  } catch (const CheckpointError& e) {
    CHECK(std::string(e.what()).find("missing tensor 'model.layers.0.self_attn.q_proj.bias' (expected shape [64])") !=
          std::string::npos);
  }
}
