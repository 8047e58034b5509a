// CPU backend: KV-cache consistency (incremental decode == full forward), causality, the
// KvCacheFull refusal, thread-count independence, and a single-token forward against a naive
// re-computation written out here from the formulas (for one token, attention returns V).
// Paged-pool behaviour (prefix reuse at split points, bf16 storage): kv_pool_test.cpp.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "tests/worker/model/temp_dir.hpp"
#include "tests/worker/cpu/pool_support.hpp"
#include "worker/cpu/cpu_backend.hpp"
#include "worker/model/checkpoint.hpp"
#include "worker/model/tiny_model.hpp"

using namespace servedeck::worker;
using servedeck::test::TempDir;

namespace {

// note: incremental and full forwards do the same fp32 operations per row in the same order,
// so they agree to ~1e-6; 1e-4 on logits of magnitude ~5 leaves room for compiler reordering.
constexpr float k_tolerance = 1e-4f;

TinyModelOptions options(const std::string& model_type = "qwen3_moe") {
  TinyModelOptions o;
  o.model_type = model_type;
  o.vocab_size = 512;
  o.num_layers = 3;
  o.mlp_only_layers = {1};
  return o;
}

std::vector<int32_t> prompt(std::size_t n) {
  std::vector<int32_t> t(n);
  for (std::size_t i = 0; i < n; ++i) t[i] = static_cast<int32_t>((i * 37 + 11) % 512);
  return t;
}

float max_abs_diff(const float* a, const float* b, std::size_t n) {
  float m = 0;
  for (std::size_t i = 0; i < n; ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

std::vector<float> widen(const TensorRef& t) {
  std::vector<float> out(t.info->element_count());
  REQUIRE(t.info->dtype == Dtype::bf16);
  for (std::size_t i = 0; i < out.size(); ++i) {
    std::uint16_t b;
    std::memcpy(&b, t.bytes.data() + 2 * i, 2);
    const std::uint32_t u = static_cast<std::uint32_t>(b) << 16;
    std::memcpy(&out[i], &u, 4);
  }
  return out;
}

/// y = W x for W (rows, cols) row-major.
std::vector<double> mv(const std::vector<float>& w, const std::vector<double>& x) {
  const std::size_t cols = x.size(), rows = w.size() / cols;
  std::vector<double> y(rows, 0.0);
  for (std::size_t r = 0; r < rows; ++r)
    for (std::size_t c = 0; c < cols; ++c) y[r] += static_cast<double>(w[r * cols + c]) * x[c];
  return y;
}

std::vector<double> rms(const std::vector<double>& x, const std::vector<float>& w, double eps) {
  double ss = 0;
  for (double v : x) ss += v * v;
  const double inv = 1.0 / std::sqrt(ss / static_cast<double>(x.size()) + eps);
  std::vector<double> y(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) y[i] = x[i] * inv * w[i];
  return y;
}

std::vector<double> swiglu(const TensorRef& g, const TensorRef& u, const TensorRef& d, const std::vector<double>& x) {
  auto a = mv(widen(g), x);
  const auto b = mv(widen(u), x);
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = a[i] / (1.0 + std::exp(-a[i])) * b[i];
  return mv(widen(d), a);
}

}  // namespace

TEST_CASE("prefill n then decode 1 gives the same last logits as a full forward over n+1") {
  for (const char* type : {"qwen3_moe", "qwen3"}) {
    INFO(type);
    TempDir dir;
    write_model(dir.path(), options(type));
    const auto ck = Checkpoint::open(dir.path());
    auto be = make_cpu_backend(ck, {2});
    const auto toks = prompt(24);
    const std::size_t v = be->vocab_size();

    testing::Pool pool(*be, 3 * 64);  // three sequences of up to 64 tokens
    KvSequence full_seq(pool.blocks, false);
    const auto full = forward_sequence(*be, full_seq, toks, true);
    REQUIRE(full.size() == toks.size() * v);
    CHECK(full_seq.length() == toks.size());

    KvSequence inc(pool.blocks, false);
    const std::span<const int32_t> all(toks);
    const auto pre = forward_sequence(*be, inc, all.first(toks.size() - 1), false);
    REQUIRE(pre.size() == v);
    const auto last = forward_sequence(*be, inc, all.last(1), false);
    REQUIRE(last.size() == v);
    CHECK(inc.length() == toks.size());
    CHECK(max_abs_diff(last.data(), full.data() + (toks.size() - 1) * v, v) <= k_tolerance);
    CHECK(max_abs_diff(pre.data(), full.data() + (toks.size() - 2) * v, v) <= k_tolerance);

    // One token at a time through the whole prompt matches every row.
    KvSequence one(pool.blocks, false);
    float worst = 0;
    for (std::size_t i = 0; i < toks.size(); ++i) {
      const auto row = forward_sequence(*be, one, all.subspan(i, 1), false);
      worst = std::max(worst, max_abs_diff(row.data(), full.data() + i * v, v));
    }
    CHECK(worst <= k_tolerance);

    // The logits are not degenerate: rows differ and have a spread.
    const auto mm = std::minmax_element(full.begin(), full.begin() + static_cast<std::ptrdiff_t>(v));
    CHECK(*mm.second - *mm.first > 1.0f);
    CHECK(max_abs_diff(full.data(), full.data() + v, v) > 0.1f);
  }
}

TEST_CASE("thread count does not change the result") {
  TempDir dir;
  write_model(dir.path(), options());
  const auto ck = Checkpoint::open(dir.path());
  auto one = make_cpu_backend(ck, {1});
  auto two = make_cpu_backend(ck, {2});
  const auto toks = prompt(40);
  testing::Pool p1(*one, 40), p2(*two, 40);
  KvSequence c1(p1.blocks, false), c2(p2.blocks, false);
  const auto a = forward_sequence(*one, c1, toks, true);
  const auto b = forward_sequence(*two, c2, toks, true);
  CHECK(max_abs_diff(a.data(), b.data(), a.size()) <= k_tolerance);
}

TEST_CASE("KvCacheFull names both numbers; a bad token or block id is refused") {
  TempDir dir;
  write_model(dir.path(), options());
  auto be = make_cpu_backend(dir.path(), {1});
  CHECK(be->name() == "cpu");
  CHECK(be->kv_bytes_per_token() == 3 * 2 * 2 * 16 * 2);  // bf16 K/V
  CHECK(make_cpu_backend(dir.path(), {1, KvDtype::f32})->kv_bytes_per_token() == 3 * 2 * 2 * 16 * 4);
  const std::vector<int32_t> table{0};  // one block of 8 rows
  const auto toks = prompt(6);
  CHECK_THROWS_AS(be->forward(KvView{table, 0}, toks, false), std::logic_error);  // no pool yet
  be->allocate_kv_pool({2, 8});
  CHECK(be->kv_pool_allocations() == 1);
  be->forward(KvView{table, 0}, toks, false);
  CHECK_THROWS_WITH_AS(be->forward(KvView{table, 6}, toks, false),
                       "KV cache full: 6 cached + 6 new tokens = 12 exceeds the capacity of 8 tokens (3072 bytes)",
                       KvCacheFull);
  const std::vector<int32_t> bad{512};
  CHECK_THROWS_AS(be->forward(KvView{table, 6}, bad, false), std::out_of_range);
  const std::vector<int32_t> outside{0, 2};  // block 2 of a pool of 2
  CHECK_THROWS_WITH_AS(be->forward(KvView{outside, 6}, toks, false),
                       "block table entry 1 = 2 is outside the KV pool of 2 blocks", std::out_of_range);
  CHECK_THROWS_AS(be->allocate_kv_pool({0, 8}), std::invalid_argument);
}

TEST_CASE("a single token's logits match a naive recomputation of the formulas") {
  // One token at position 0: attention weights are [1], so attn = o_proj(v_proj(rms(x))) and
  // q/k/RoPE drop out; the MoE routing, SwiGLU, norms and lm_head are all exercised.
  TempDir dir;
  auto o = options();
  o.num_layers = 2;
  o.mlp_only_layers = {1};
  write_model(dir.path(), o);
  const auto ck = Checkpoint::open(dir.path());
  const auto& d = ck.description();
  const auto h = static_cast<std::size_t>(d.hidden_size);
  const int32_t token = 77;

  const auto emb = widen(ck.embed_tokens());
  std::vector<double> x(emb.begin() + token * static_cast<std::ptrdiff_t>(h),
                        emb.begin() + (token + 1) * static_cast<std::ptrdiff_t>(h));
  for (std::size_t l = 0; l < ck.layers().size(); ++l) {
    const auto& L = ck.layers()[l];
    auto xn = rms(x, widen(L.input_norm), d.rms_norm_eps);
    const auto v = mv(widen(L.v_proj), xn);
    // GQA: head hh reads KV head hh / (heads / kv_heads).
    std::vector<double> attn(static_cast<std::size_t>(d.num_heads * d.head_dim));
    const auto hd = static_cast<std::size_t>(d.head_dim);
    const auto group = static_cast<std::size_t>(d.num_heads / d.num_kv_heads);
    for (std::size_t hh = 0; hh < static_cast<std::size_t>(d.num_heads); ++hh)
      for (std::size_t j = 0; j < hd; ++j) attn[hh * hd + j] = v[(hh / group) * hd + j];
    const auto ao = mv(widen(L.o_proj), attn);
    for (std::size_t i = 0; i < h; ++i) x[i] += ao[i];
    xn = rms(x, widen(L.post_attn_norm), d.rms_norm_eps);
    std::vector<double> y(h, 0.0);
    if (d.layers[l].mlp == MlpKind::moe) {
      auto logits = mv(widen(L.router), xn);
      const double mx = *std::max_element(logits.begin(), logits.end());
      double s = 0;
      for (auto& z : logits) s += (z = std::exp(z - mx));
      for (auto& z : logits) z /= s;
      std::vector<std::size_t> idx(logits.size());
      std::iota(idx.begin(), idx.end(), 0);
      std::sort(idx.begin(), idx.end(), [&](std::size_t a, std::size_t b) { return logits[a] > logits[b]; });
      const double top = logits[idx[0]] + logits[idx[1]];
      for (std::size_t j = 0; j < 2; ++j) {
        const auto& E = L.experts[idx[j]];
        const auto ey = swiglu(E.gate, E.up, E.down, xn);
        for (std::size_t i = 0; i < h; ++i) y[i] += logits[idx[j]] / top * ey[i];
      }
    } else {
      y = swiglu(L.mlp_gate, L.mlp_up, L.mlp_down, xn);
    }
    for (std::size_t i = 0; i < h; ++i) x[i] += y[i];
  }
  const auto ref = mv(widen(ck.lm_head()), rms(x, widen(ck.final_norm()), d.rms_norm_eps));

  auto be = make_cpu_backend(ck, {2, KvDtype::f32});  // the formulas' fp32 K/V
  testing::Pool pool(*be, 1);
  KvSequence seq(pool.blocks, false);
  const std::vector<int32_t> toks{token};
  const auto got = forward_sequence(*be, seq, toks, false);
  REQUIRE(got.size() == ref.size());
  double worst = 0;
  std::size_t worst_i = 0;
  for (std::size_t i = 0; i < ref.size(); ++i)
    if (std::fabs(got[i] - ref[i]) > worst) worst = std::fabs(got[i] - ref[i]), worst_i = i;
  INFO("worst at vocab id " << worst_i << ": expected " << ref[worst_i] << ", got " << got[worst_i]);
  CHECK(worst <= 1e-3);
}
