// The CPU forward against logits recorded from Hugging Face transformers (5.17,
// Glm4MoeForCausalLM and Qwen3MoeForCausalLM in fp32, eager attention) on the checkpoints of
// transformers_fixtures.hpp: two GLM-4.5-shaped glm4_moe models (grouped routing with QK-norm;
// GLM-4.5-Air's structure without it) and a Qwen3-MoE with YaRN. The recording
// (fixtures/transformers/, scripts/record_transformers_logits.py) names the hash of each
// checkpoint it read; the test rewrites the checkpoint, checks the hash, then runs one forward
// pass per prompt and one token at a time through the KV cache, and compares every logit.
//
// Thresholds as scripts/compare_transformers.py (docs/correctness.md): both sides compute in
// fp32 from the same BF16 weights, so only the order of summation differs (~1e-5 on logits of
// std ~4); a wrong router, RoPE or bias moves logits by O(1).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "tests/worker/cpu/transformers_fixtures.hpp"
#include "tests/worker/model/temp_dir.hpp"
#include "worker/cpu/cpu_backend.hpp"
#include "worker/engine/kv_sequence.hpp"
#include "worker/model/checkpoint.hpp"

using namespace servedeck::worker;
using servedeck::test::TempDir;

namespace {

constexpr double k_max_abs_diff = 5e-3;
constexpr double k_min_top1 = 0.98;
constexpr double k_max_kl = 1e-4;

std::string fixtures_dir() {
  const char* env = std::getenv("SERVEDECK_SOURCE_DIR");
  return std::string(env ? env : SERVEDECK_SOURCE_DIR) + "/tests/worker/cpu/fixtures/transformers/";
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE_MESSAGE(in.good(), "cannot read " << path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct Figures {
  double max_abs = 0, kl_sum = 0, kl_max = 0;
  std::size_t positions = 0, top1_agree = 0;
  void add(const float* ref, const float* ours, std::size_t vocab) {
    std::size_t ar = 0, ao = 0;
    double mr = -1e300, mo = -1e300;
    for (std::size_t i = 0; i < vocab; ++i) {
      max_abs = std::max(max_abs, std::fabs(static_cast<double>(ref[i]) - ours[i]));
      if (ref[i] > ref[ar]) ar = i;
      if (ours[i] > ours[ao]) ao = i;
      mr = std::max(mr, static_cast<double>(ref[i]));
      mo = std::max(mo, static_cast<double>(ours[i]));
    }
    double sr = 0, so = 0;
    for (std::size_t i = 0; i < vocab; ++i) {
      sr += std::exp(ref[i] - mr);
      so += std::exp(ours[i] - mo);
    }
    double kl = 0;  // KL(ref || ours) in nats
    for (std::size_t i = 0; i < vocab; ++i) {
      const double lp = ref[i] - mr - std::log(sr), lq = ours[i] - mo - std::log(so);
      kl += std::exp(lp) * (lp - lq);
    }
    kl_sum += kl;
    kl_max = std::max(kl_max, kl);
    top1_agree += ar == ao;
    ++positions;
  }
  double top1() const { return positions ? static_cast<double>(top1_agree) / static_cast<double>(positions) : 0; }
};

std::string hex64(std::uint64_t h) {
  char b[17];
  std::snprintf(b, sizeof b, "%016llx", static_cast<unsigned long long>(h));
  return b;
}

}  // namespace

TEST_CASE("CPU forward = transformers' recorded logits: glm4_moe (grouped routing, QK-norm on and off) and Qwen3-MoE YaRN") {
  const auto reference = nlohmann::json::parse(slurp(fixtures_dir() + "reference.json"));
  const auto prompts = testing::equivalence_prompts();
  std::vector<std::size_t> lengths;
  for (const auto& p : prompts) lengths.push_back(p.size());
  REQUIRE(reference["prompts"].get<std::vector<std::size_t>>() == lengths);
  const auto fixtures = testing::equivalence_fixtures();
  REQUIRE(fixtures.size() == reference["models"].size());
  for (const auto& f : fixtures) {
    CAPTURE(f.name);
    REQUIRE(reference["models"].contains(f.name));
    const auto& rec = reference["models"][f.name];
    TempDir dir;
    write_model(dir.path(), f.options);
    REQUIRE_MESSAGE(hex64(testing::fnv1a64(slurp(dir / "model.safetensors"))) == rec["fnv1a64"].get<std::string>(),
                    "the checkpoint written from transformers_fixtures.hpp is not the one the logits were recorded on "
                    "(the tiny-model writer changed?): re-record with scripts/record_transformers_logits.py");
    const auto ck = Checkpoint::open(dir.path());

    // RoPE's table and attention factor are transformers' own (the YaRN blend, the partial dims).
    const auto inv = ck.description().rope_inv_freq();
    const auto ref_inv = rec["inv_freq"].get<std::vector<double>>();
    REQUIRE(inv.size() == ref_inv.size());
    double worst_freq = 0;
    for (std::size_t i = 0; i < inv.size(); ++i) worst_freq = std::max(worst_freq, std::fabs(inv[i] - ref_inv[i]) / ref_inv[i]);
    CHECK(worst_freq <= 2e-7);  // within one fp32 rounding
    CHECK(ck.description().rope_scaling.attention_factor == doctest::Approx(rec["attention_scaling"].get<double>()).epsilon(1e-12));
    CHECK(ck.skipped_mtp_tensors() == rec["mtp_tensors_skipped"].get<std::size_t>());

    const std::string ref_bytes = slurp(fixtures_dir() + f.name + ".f32");
    const std::size_t vocab = rec["vocab_size"].get<std::size_t>();
    REQUIRE(ref_bytes.size() == rec["positions"].get<std::size_t>() * vocab * sizeof(float));
    std::vector<float> ref(ref_bytes.size() / sizeof(float));
    std::memcpy(ref.data(), ref_bytes.data(), ref_bytes.size());

    auto backend = make_cpu_backend(ck, CpuBackendOptions{2, KvDtype::f32});
    REQUIRE(backend->vocab_size() == vocab);
    for (const bool incremental : {false, true}) {
      Figures fig;
      std::size_t row = 0;
      for (const auto& p : prompts) {
        KvBlockPool pool({(p.size() + 15) / 16, 16});
        backend->allocate_kv_pool(pool.shape());
        KvSequence seq(pool, false);
        std::vector<float> logits;
        if (incremental) {
          for (auto tok : p) {
            const auto one = forward_sequence(*backend, seq, std::span<const int32_t>(&tok, 1), false);
            logits.insert(logits.end(), one.begin(), one.end());
          }
        } else {
          logits = forward_sequence(*backend, seq, p, true);
        }
        REQUIRE(logits.size() == p.size() * vocab);
        for (std::size_t t = 0; t < p.size(); ++t, ++row) fig.add(ref.data() + row * vocab, logits.data() + t * vocab, vocab);
      }
      MESSAGE(f.name << std::string(incremental ? " (one token at a time)" : " (whole prompts)") << ": " << fig.positions
                     << " positions, max |dlogit| " << fig.max_abs << " (reference logit std "
                     << rec["logit_std"].get<double>() << "), top-1 agreement " << fig.top1() << ", KL mean "
                     << fig.kl_sum / static_cast<double>(fig.positions) << " max " << fig.kl_max << " nats");
      CHECK(fig.max_abs <= k_max_abs_diff);
      CHECK(fig.top1() >= k_min_top1);
      CHECK(fig.kl_max <= k_max_kl);
    }
  }
}
