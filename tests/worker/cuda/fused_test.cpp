// The fused decode kernels (fused.cuh) against the unfused kernels (kernels.cuh, each tested
// against a CPU reference in kernels_test.cpp), on fresh random inputs with poisoned outputs.
// Tolerances: the same fp32 arithmetic in another summation order → relative L2 error < 1e-5;
// routing ids identical.
#include <doctest/doctest.h>

#include <cmath>
#include <algorithm>
#include <cstdlib>
#include <random>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>

#include "tests/worker/cuda/gpu_test_support.hpp"
#include "worker/cuda/fused.cuh"
#include "worker/cuda/kernels.cuh"
#include "worker/engine/sampler.hpp"

using namespace servedeck::worker::cuda;
using gpu_test::DeviceBuffer;

namespace {

std::vector<__nv_bfloat16> rand_bf16(std::size_t n, unsigned seed, float scale) {
  return gpu_test::to_bf16(gpu_test::random_floats(n, seed, scale));
}

// E random experts of shape (H, I) in VRAM, each a gate | up | down block (3·I·H bf16), and the
// device table of their pointers.
struct DeviceExperts {
  DeviceBuffer<__nv_bfloat16> blocks;
  DeviceBuffer<const __nv_bfloat16*> ptrs;
  ExpertTable t;
  DeviceExperts(int E, int H, int I, unsigned seed)
      : blocks(rand_bf16(3ull * I * H * static_cast<std::size_t>(E), seed, 0.1f)), ptrs(pointers(blocks.ptr, E, 3ull * I * H)), t{ptrs.ptr, H, I} {}
  static std::vector<const __nv_bfloat16*> pointers(const __nv_bfloat16* base, int E, std::size_t block) {
    std::vector<const __nv_bfloat16*> v(static_cast<std::size_t>(E));
    for (int e = 0; e < E; ++e) v[static_cast<std::size_t>(e)] = base + block * static_cast<std::size_t>(e);
    return v;
  }
};

// E experts of shape (H, I) in VRAM: the unfused MoE from (xn, ids1, w1) against fused gate/up +
// down from (xn2, ids2, w2), on the same residual.
void check_fused_moe(int E, int K, int H, int I, unsigned seed, const float* xn, const int32_t* ids1, const float* w1, const float* xn2,
                     const int32_t* ids2, const float* w2) {
  const DeviceExperts experts(E, H, I, seed);
  const ExpertTable& t = experts.t;
  auto out_h = gpu_test::random_floats(static_cast<std::size_t>(H), seed + 1, 1.f);
  DeviceBuffer<float> out1(out_h), out2(out_h), scratch(static_cast<std::size_t>(K) * 2 * I), partial(static_cast<std::size_t>(K) * H),
      act(static_cast<std::size_t>(K) * I);
  launch_moe_decode(t, xn, ids1, w1, K, scratch.ptr, partial.ptr, out1.ptr, nullptr);
  act.poison();
  launch_moe_gate_up_fused(t, xn2, ids2, K, act.ptr, nullptr);
  launch_moe_down_fused(t, act.ptr, ids2, w2, K, out2.ptr, nullptr);
  CHECK(gpu_test::compare(out1.get(), out2.get(), "fused moe") < 1e-5);
}
}  // namespace

TEST_CASE("norm_gemv equals rmsnorm then gemv (and writes the normalised x)") {
  gpu_test::skip_without_gpu();
  // 5120x2048, 40x64, 3000x1024: rows staged in shared memory, norm weights loaded before the
  // wait (2 float4 per thread); 1000x4096: 4 per thread; 600x6144: the strided norm;
  // 30000x1024: the row-per-warp kernel.
  for (auto [out, in] : {std::pair{40, 64}, std::pair{5120, 2048}, std::pair{3000, 1024}, std::pair{1000, 4096}, std::pair{600, 6144},
                         std::pair{30000, 1024}}) {
    DeviceBuffer<__nv_bfloat16> W(rand_bf16(static_cast<std::size_t>(out) * in, 3 + out, 0.05f));
    DeviceBuffer<__nv_bfloat16> nw(rand_bf16(static_cast<std::size_t>(in), 4, 1.f));
    DeviceBuffer<float> x(gpu_test::random_floats(static_cast<std::size_t>(in), 5 + in, 2.f));
    DeviceBuffer<float> xn(static_cast<std::size_t>(in)), want(static_cast<std::size_t>(out)), got(static_cast<std::size_t>(out)),
        xn2(static_cast<std::size_t>(in));
    launch_rmsnorm(x.ptr, nw.ptr, xn.ptr, 1, in, 1e-6f, nullptr);
    launch_gemv_bf16(W.ptr, xn.ptr, want.ptr, out, in, false, nullptr);
    got.poison();
    xn2.poison();
    launch_norm_gemv_bf16(W.ptr, x.ptr, nw.ptr, 1e-6f, got.ptr, out, in, false, xn2.ptr, nullptr);
    CHECK(gpu_test::compare(want.get(), got.get(), "norm_gemv") < 1e-5);
    CHECK(gpu_test::compare(xn.get(), xn2.get(), "norm_gemv xn") < 1e-6);
  }
}

TEST_CASE("gemv_pdl (staged and row-per-warp) equals gemv, accumulating") {
  gpu_test::skip_without_gpu();
  // 2048x4096 (the o-proj shape) and 40x64 are staged in shared memory; 20000x2048 is not.
  for (auto [out, in] : {std::pair{2048, 4096}, std::pair{40, 64}, std::pair{20000, 2048}}) {
    DeviceBuffer<__nv_bfloat16> W(rand_bf16(static_cast<std::size_t>(out) * in, 7 + out, 0.05f));
    DeviceBuffer<float> x(gpu_test::random_floats(static_cast<std::size_t>(in), 8 + in, 1.f));
    const auto y0 = gpu_test::random_floats(static_cast<std::size_t>(out), 9, 1.f);
    DeviceBuffer<float> want(y0), got(y0);
    launch_gemv_bf16(W.ptr, x.ptr, want.ptr, out, in, true, nullptr);
    launch_gemv_bf16_pdl(W.ptr, x.ptr, got.ptr, out, in, true, nullptr);
    CHECK(gpu_test::compare(want.get(), got.get(), "gemv_pdl") < 1e-5);
  }
}

TEST_CASE("fused MoE down equals the unfused MoE for inter 768, 512, 1024 and k above the warp count") {
  gpu_test::skip_without_gpu();
  const int E = 16, H = 256;
  for (auto [I, K] : {std::pair{768, 8}, std::pair{512, 12}, std::pair{1024, 8}, std::pair{96, 3}}) {
    const DeviceExperts experts(E, H, I, 41 + I);
    const ExpertTable& t = experts.t;
    std::vector<int32_t> ids_h(static_cast<std::size_t>(K));
    for (int j = 0; j < K; ++j) ids_h[static_cast<std::size_t>(j)] = (j * 7 + 3) % E;
    DeviceBuffer<int32_t> ids(ids_h);
    DeviceBuffer<float> w(gpu_test::random_floats(static_cast<std::size_t>(K), 42, 1.f));
    DeviceBuffer<float> xn(gpu_test::random_floats(static_cast<std::size_t>(H), 43, 1.f));
    const auto out_h = gpu_test::random_floats(static_cast<std::size_t>(H), 44, 1.f);
    DeviceBuffer<float> out1(out_h), out2(out_h), scratch(static_cast<std::size_t>(K) * 2 * I), partial(static_cast<std::size_t>(K) * H),
        act(static_cast<std::size_t>(K) * I);
    launch_moe_decode(t, xn.ptr, ids.ptr, w.ptr, K, scratch.ptr, partial.ptr, out1.ptr, nullptr);
    act.poison();
    launch_moe_gate_up_fused(t, xn.ptr, ids.ptr, K, act.ptr, nullptr);
    launch_moe_down_fused(t, act.ptr, ids.ptr, w.ptr, K, out2.ptr, nullptr);
    CHECK(gpu_test::compare(out1.get(), out2.get(), "fused moe down") < 1e-5);
  }
}

// The decode attention over the paged pool (launch_attention_decode_paged) against a double
// reference on the same bf16 inputs: q/k-norm + RoPE by the unfused kernels, q, k, v and the
// context rounded to bf16 as the kernel rounds them. The kernel also rounds P to bf16 (relative
// 2^-9 per weight, the flash prefill kernels' numerics): relative L2 < 3e-3, as
// flash_attention_test.cpp. The appended row is the rounded k and v (within one bf16 step of
// the reference's rounding: the norms' fp32 sums run in another order), no other pool row
// changes, and the counters are left at zero. Block tables are shuffled; contexts from one
// position to every split of many units, positions at and inside unit and block boundaries.
TEST_CASE("paged decode attention equals q/k-norm + RoPE + KV append + attention over the block table") {
  gpu_test::skip_without_gpu();
  struct Shape {
    int hq, hk, hd, block_tokens;
  };
  for (const Shape sh : {Shape{8, 2, 32, 16}, Shape{32, 4, 128, 16}, Shape{8, 2, 48, 32}, Shape{8, 2, 160, 16}, Shape{4, 1, 256, 16},
                         Shape{16, 1, 16, 16}, Shape{32, 4, 128, 64}, Shape{24, 2, 32, 16}, Shape{24, 2, 128, 16},  // group 12: GLM-4.5-Air's
                         Shape{16, 1, 256, 16}}) {  // 18 rows of q|k|v over 8 warps: a warp's third row
    const int hq = sh.hq, hk = sh.hk, hd = sh.hd, B = sh.block_tokens, q_dim = hq * hd, kv_dim = hk * hd, group = hq / hk;
    const int splits = attention_splits(hk);
    for (int pos : {0, 1, 15, 16, 37, 300, 2100, 4223, 8191}) {  // 8191: 64 splits in use for one KV head (two per lane in the split merge)
      CAPTURE(hd);
      CAPTURE(B);
      CAPTURE(pos);
      const int blocks = pos / B + 1, pool_blocks = blocks + 3;
      // The sequence's blocks: `blocks` distinct ids of the pool in shuffled order.
      std::vector<int32_t> ids(static_cast<std::size_t>(pool_blocks));
      for (int i = 0; i < pool_blocks; ++i) ids[static_cast<std::size_t>(i)] = i;
      std::mt19937 shuffle_rng(static_cast<unsigned>(pos + 31 * hd + B));
      std::shuffle(ids.begin(), ids.end(), shuffle_rng);
      const std::vector<int32_t> table(ids.begin(), ids.begin() + blocks);
      const std::size_t rows = static_cast<std::size_t>(pool_blocks) * B;
      const auto qkv_h = gpu_test::random_floats(static_cast<std::size_t>(q_dim + 2 * kv_dim), 11 + pos + hd, 1.f);
      const auto kpool_h = rand_bf16(rows * kv_dim, 12 + pos, 1.f), vpool_h = rand_bf16(rows * kv_dim, 13 + pos, 1.f);
      DeviceBuffer<__nv_bfloat16> qn(rand_bf16(static_cast<std::size_t>(hd), 14, 1.f)), kn(rand_bf16(static_cast<std::size_t>(hd), 15, 1.f));
      DeviceBuffer<int32_t> dpos(std::vector<int32_t>{pos}), dtable(table);
      // Reference q and k: the unfused kernels.
      DeviceBuffer<float> q(std::vector<float>(qkv_h.begin(), qkv_h.begin() + q_dim));
      DeviceBuffer<float> k(std::vector<float>(qkv_h.begin() + q_dim, qkv_h.begin() + q_dim + kv_dim));
      launch_rmsnorm(q.ptr, qn.ptr, q.ptr, hq, hd, 1e-6f, nullptr);
      launch_rmsnorm(k.ptr, kn.ptr, k.ptr, hk, hd, 1e-6f, nullptr);
      launch_rope(q.ptr, k.ptr, hq, hk, hd, hd, dpos.ptr, 1e6f, nullptr);
      const auto qr = q.get(), kr = k.get();
      // The kernel.
      DeviceBuffer<float> qkv(qkv_h), got(static_cast<std::size_t>(q_dim));
      DeviceBuffer<__nv_bfloat16> kpool(kpool_h), vpool(vpool_h);
      got.poison();
      DeviceBuffer<float> freq(rope_inv_freq(1e6f, hd)), scratch(attention_scratch_floats(hq, hd, splits));
      DeviceBuffer<unsigned int> counters(std::vector<unsigned int>(static_cast<std::size_t>(hk), 0u));
      const AttentionShape shape{hq, hk, hd, hd, 1e-6f, freq.ptr, splits, scratch.ptr, counters.ptr};
      launch_attention_decode_paged(qkv.ptr, qn.ptr, kn.ptr, PagedKv{kpool.ptr, vpool.ptr, dtable.ptr, B}, got.ptr, shape, dpos.ptr, nullptr);
      for (unsigned int cnt : counters.get()) CHECK(cnt == 0u);
      // Reference attention in double over the bf16 context (the new row: the rounded k, v).
      auto bf = [](float x) { return __bfloat162float(__float2bfloat16(x)); };
      const auto kp = gpu_test::from_bf16(kpool_h), vp = gpu_test::from_bf16(vpool_h);
      auto row_of = [&](int p) { return static_cast<std::size_t>(table[static_cast<std::size_t>(p / B)]) * B + p % B; };
      std::vector<float> want(static_cast<std::size_t>(q_dim));
      for (int h = 0; h < hq; ++h) {
        const int kvh = h / group;
        std::vector<double> sc(static_cast<std::size_t>(pos + 1));
        double mx = -1e300;
        for (int t = 0; t <= pos; ++t) {
          double dot = 0;
          for (int i = 0; i < hd; ++i) {
            const double kv = t == pos ? bf(kr[static_cast<std::size_t>(kvh * hd + i)]) : kp[row_of(t) * kv_dim + kvh * hd + i];
            dot += static_cast<double>(bf(qr[static_cast<std::size_t>(h * hd + i)])) * kv;
          }
          sc[static_cast<std::size_t>(t)] = dot / std::sqrt(static_cast<double>(hd));
          mx = std::max(mx, sc[static_cast<std::size_t>(t)]);
        }
        double sum = 0;
        for (auto& v : sc) sum += (v = std::exp(v - mx));
        for (int i = 0; i < hd; ++i) {
          double o = 0;
          for (int t = 0; t <= pos; ++t) {
            const double vv = t == pos ? bf(qkv_h[static_cast<std::size_t>(q_dim + kv_dim + kvh * hd + i)]) : vp[row_of(t) * kv_dim + kvh * hd + i];
            o += sc[static_cast<std::size_t>(t)] * vv;
          }
          want[static_cast<std::size_t>(h * hd + i)] = static_cast<float>(o / sum);
        }
      }
      CHECK(gpu_test::compare(want, got.get(), "paged attention", 1e-2) < 3e-3);
      // The appended row, and every other row unchanged.
      const auto kp2 = gpu_test::from_bf16(kpool.get()), vp2 = gpu_test::from_bf16(vpool.get());
      const std::size_t at = row_of(pos) * kv_dim;
      std::vector<float> k_want(kr.begin(), kr.end()), k_got(kp2.begin() + static_cast<std::ptrdiff_t>(at), kp2.begin() + static_cast<std::ptrdiff_t>(at + kv_dim));
      for (auto& x : k_want) x = bf(x);
      CHECK(gpu_test::compare(k_want, k_got, "appended k", 1e-2) < 4e-3);
      for (int i = 0; i < kv_dim; ++i)
        CHECK(vp2[at + static_cast<std::size_t>(i)] == bf(qkv_h[static_cast<std::size_t>(q_dim + kv_dim + i)]));
      std::size_t changed = 0;
      for (std::size_t i = 0; i < kp.size(); ++i)
        if ((i < at || i >= at + kv_dim) && (kp[i] != kp2[i] || vp[i] != vp2[i])) ++changed;
      CHECK(changed == 0);
    }
  }
}

TEST_CASE("fused router (last-block top-k, counters) and fused MoE equal the unfused kernels") {
  gpu_test::skip_without_gpu();
  const int E = 128, K = 8, H = 512, I = 96;
  DeviceBuffer<__nv_bfloat16> R(rand_bf16(static_cast<std::size_t>(E) * H, 21, 0.2f)), nw(rand_bf16(static_cast<std::size_t>(H), 22, 1.f));
  DeviceBuffer<float> x(gpu_test::random_floats(static_cast<std::size_t>(H), 23, 1.f));
  // Reference routing.
  DeviceBuffer<float> xn(static_cast<std::size_t>(H)), logits(static_cast<std::size_t>(E)), w1(static_cast<std::size_t>(K));
  DeviceBuffer<int32_t> ids1(static_cast<std::size_t>(K));
  launch_rmsnorm(x.ptr, nw.ptr, xn.ptr, 1, H, 1e-6f, nullptr);
  launch_gemv_bf16(R.ptr, xn.ptr, logits.ptr, E, H, false, nullptr);
  launch_router_topk(logits.ptr, E, K, true, ids1.ptr, w1.ptr, nullptr);
  // Fused routing, run twice (the done counter must reset itself).
  std::vector<uint8_t> flags(E, 0);
  for (int e = 0; e < E; e += 2) flags[static_cast<std::size_t>(e)] = 1;
  DeviceBuffer<uint8_t> dflags(flags);
  DeviceBuffer<unsigned long long> counters(std::vector<unsigned long long>{0, 0}), lc(std::vector<unsigned long long>(E, 0));
  DeviceBuffer<unsigned int> done(std::vector<unsigned int>{0});
  DeviceBuffer<float> xn2(static_cast<std::size_t>(H)), logits2(static_cast<std::size_t>(E)), w2(static_cast<std::size_t>(K));
  DeviceBuffer<int32_t> ids2(static_cast<std::size_t>(K));
  for (int rep = 0; rep < 2; ++rep) {
    ids2.poison();
    w2.poison();
    launch_router_fused(R.ptr, x.ptr, nw.ptr, 1e-6f, xn2.ptr, E, H, K, true,
                        RouterOutputs{logits2.ptr, ids2.ptr, w2.ptr, done.ptr, dflags.ptr, counters.ptr, lc.ptr}, nullptr);
    CHECK(ids2.get() == ids1.get());
    CHECK(gpu_test::compare(w1.get(), w2.get(), "router weights") < 1e-5);
  }
  CHECK(done.get()[0] == 0u);
  auto ids = ids1.get();
  unsigned long long hot = 0;
  for (int j = 0; j < K; ++j) hot += flags[static_cast<std::size_t>(ids[static_cast<std::size_t>(j)])];
  auto c = counters.get();
  CHECK(c[0] == 2 * hot);
  CHECK(c[0] + c[1] == 2ull * K);
  auto lcv = lc.get();
  for (int j = 0; j < K; ++j) CHECK(lcv[static_cast<std::size_t>(ids[static_cast<std::size_t>(j)])] == 2ull);

  // Experts: a device table of E blocks (all in VRAM; the UVA case is covered by kernels_test).
  check_fused_moe(E, K, H, I, 31, xn.ptr, ids1.ptr, w1.ptr, xn2.ptr, ids2.ptr, w2.ptr);
}

TEST_CASE("fused router and gate/up at hidden 2048, 4096 and 6144 equal the unfused kernels") {
  gpu_test::skip_without_gpu();
  // 2048: the router's norm weights prefetched (4 float4 per thread) and gate/up with 8 column
  // blocks per lane (the Qwen3-30B-A3B shape); 4096: 8 float4 per thread and the one-unit-per-
  // warp gate/up; 6144: the strided norm.
  const int E = 64, K = 8, I = 64;
  for (int H : {2048, 4096, 6144}) {
    CAPTURE(H);
    DeviceBuffer<__nv_bfloat16> R(rand_bf16(static_cast<std::size_t>(E) * H, 51 + H, 0.1f)), nw(rand_bf16(static_cast<std::size_t>(H), 52, 1.f));
    DeviceBuffer<float> x(gpu_test::random_floats(static_cast<std::size_t>(H), 53 + H, 1.f));
    DeviceBuffer<float> xn(static_cast<std::size_t>(H)), logits(static_cast<std::size_t>(E)), w1(static_cast<std::size_t>(K));
    DeviceBuffer<int32_t> ids1(static_cast<std::size_t>(K));
    launch_rmsnorm(x.ptr, nw.ptr, xn.ptr, 1, H, 1e-6f, nullptr);
    launch_gemv_bf16(R.ptr, xn.ptr, logits.ptr, E, H, false, nullptr);
    launch_router_topk(logits.ptr, E, K, true, ids1.ptr, w1.ptr, nullptr);
    DeviceBuffer<uint8_t> dflags(std::vector<uint8_t>(E, 1));
    DeviceBuffer<unsigned long long> counters(std::vector<unsigned long long>{0, 0}), lc(std::vector<unsigned long long>(E, 0));
    DeviceBuffer<unsigned int> done(std::vector<unsigned int>{0});
    DeviceBuffer<float> xn2(static_cast<std::size_t>(H)), logits2(static_cast<std::size_t>(E)), w2(static_cast<std::size_t>(K));
    DeviceBuffer<int32_t> ids2(static_cast<std::size_t>(K));
    ids2.poison();
    xn2.poison();
    launch_router_fused(R.ptr, x.ptr, nw.ptr, 1e-6f, xn2.ptr, E, H, K, true,
                        RouterOutputs{logits2.ptr, ids2.ptr, w2.ptr, done.ptr, dflags.ptr, counters.ptr, lc.ptr}, nullptr);
    CHECK(ids2.get() == ids1.get());
    CHECK(gpu_test::compare(w1.get(), w2.get(), "router weights") < 1e-5);
    CHECK(gpu_test::compare(xn.get(), xn2.get(), "router xn") < 1e-6);
    CHECK(counters.get()[0] == static_cast<unsigned long long>(K));

    check_fused_moe(E, K, H, I, static_cast<unsigned>(54 + H), xn.ptr, ids1.ptr, w1.ptr, xn2.ptr, ids2.ptr, w2.ptr);
  }
}

TEST_CASE("the staged GEMVs' paced copies and x first change when rows land, not the sums") {
  gpu_test::skip_without_gpu();
  // q|k|v 5120x2048 with its norm (one piece, half the rows before the wait) and the o-proj
  // 2048x4096 accumulating (16 paced pieces) against the unfused kernels; a 3072-wide normed GEMV
  // of 1100 rows (4 float4 of x per norm thread, 9 rows per block: the 16-warp kernel's second
  // group of 8 rows has one row); and the same launches repeated: bit-identical every time.
  DeviceBuffer<__nv_bfloat16> Wq(rand_bf16(5120ull * 2048, 55, 0.05f)), nw(rand_bf16(4096, 56, 1.f)), Wo(rand_bf16(2048ull * 4096, 57, 0.05f)),
      W3(rand_bf16(1100ull * 3072, 60, 0.05f));
  DeviceBuffer<float> x(gpu_test::random_floats(4096, 58, 1.f));
  const auto y0 = gpu_test::random_floats(5120, 59, 1.f);
  auto fused = [&] {
    DeviceBuffer<float> q(y0), o(y0), y3(1100);
    launch_norm_gemv_bf16(Wq.ptr, x.ptr, nw.ptr, 1e-6f, q.ptr, 5120, 2048, false, nullptr, nullptr);
    launch_gemv_bf16_pdl(Wo.ptr, x.ptr, o.ptr, 2048, 4096, true, nullptr);
    launch_norm_gemv_bf16(W3.ptr, x.ptr, nw.ptr, 1e-6f, y3.ptr, 1100, 3072, false, nullptr, nullptr);
    return std::tuple{q.get(), o.get(), y3.get()};
  };
  const auto base = fused();
  DeviceBuffer<float> xn(4096), q1(5120), o1(y0), y31(1100);
  launch_rmsnorm(x.ptr, nw.ptr, xn.ptr, 1, 2048, 1e-6f, nullptr);
  launch_gemv_bf16(Wq.ptr, xn.ptr, q1.ptr, 5120, 2048, false, nullptr);
  launch_gemv_bf16(Wo.ptr, x.ptr, o1.ptr, 2048, 4096, true, nullptr);
  CHECK(gpu_test::compare(q1.get(), std::get<0>(base), "q|k|v") < 1e-5);
  CHECK(gpu_test::compare(o1.get(), std::get<1>(base), "o-proj") < 1e-5);
  launch_rmsnorm(x.ptr, nw.ptr, xn.ptr, 1, 3072, 1e-6f, nullptr);
  launch_gemv_bf16(W3.ptr, xn.ptr, y31.ptr, 1100, 3072, false, nullptr);
  CHECK(gpu_test::compare(y31.get(), std::get<2>(base), "3072-wide") < 1e-5);
  for (int rep = 0; rep < 3; ++rep) CHECK(fused() == base);
}

namespace {

// The decode step's counters for `layers` MoE layers in one device allocation, as the backend's
// (handshakes.cuh): [0] the epoch, then per layer the heads and logits counts.
struct TestSync {
  int layers;
  DeviceBuffer<unsigned int> words;
  explicit TestSync(int n) : layers(n), words(std::vector<unsigned int>(1 + 2 * static_cast<std::size_t>(n), 0u)) {}
  StepSync layer(int l) const { return StepSync{words.ptr, words.ptr + 1 + l, words.ptr + 1 + layers + l}; }
  std::vector<unsigned int> get() const { return words.get(); }
};

}  // namespace

TEST_CASE("the folded router and gate/up ranking its logits equal o-proj + router + gate/up") {
  gpu_test::skip_without_gpu();
  // The benchmark's shapes and a small one; renormalised top-k and plain softmax weights. The
  // folded logits are the router's times rms(x) (compared after dividing by it, on the host);
  // the ids must be the same experts in the same order. No attention runs here: its heads' count
  // (H2) is set to what the attention would have published.
  for (auto [E, K, H, Q, I] : {std::tuple{128, 8, 2048, 4096, 768}, std::tuple{16, 4, 256, 512, 96}}) {
    for (const bool renorm : {true, false}) {
      CAPTURE(E);
      CAPTURE(renorm);
      const int n_heads = Q / 128;
      const unsigned s = static_cast<unsigned>(71 + H + (renorm ? 1 : 0));
      DeviceBuffer<__nv_bfloat16> Wo(rand_bf16(static_cast<std::size_t>(H) * Q, s, 0.02f)), R(rand_bf16(static_cast<std::size_t>(E) * H, s + 1, 0.2f)),
          nw(rand_bf16(static_cast<std::size_t>(H), s + 2, 1.f));
      const auto h_host = gpu_test::random_floats(static_cast<std::size_t>(H), s + 3, 1.f);
      DeviceBuffer<float> h(h_host), a(gpu_test::random_floats(static_cast<std::size_t>(Q), s + 4, 1.f));
      const DeviceExperts experts(E, H, I, s + 5);
      DeviceBuffer<uint8_t> flags(std::vector<uint8_t>(static_cast<std::size_t>(E), 1));
      DeviceBuffer<unsigned long long> counters(std::vector<unsigned long long>{0, 0}), lc(std::vector<unsigned long long>(static_cast<std::size_t>(E), 0));
      DeviceBuffer<unsigned int> done(std::vector<unsigned int>{0});
      // Reference: the residual updated in place, the fused router on it, gate/up on its xn.
      DeviceBuffer<float> x1(h_host), xn(static_cast<std::size_t>(H)), logits1(static_cast<std::size_t>(E)), w1(static_cast<std::size_t>(K)),
          act1(static_cast<std::size_t>(K) * I);
      DeviceBuffer<int32_t> ids1(static_cast<std::size_t>(K));
      launch_gemv_bf16_pdl(Wo.ptr, a.ptr, x1.ptr, H, Q, true, nullptr);
      launch_router_fused(R.ptr, x1.ptr, nw.ptr, 1e-6f, xn.ptr, E, H, K, renorm,
                          RouterOutputs{logits1.ptr, ids1.ptr, w1.ptr, done.ptr, flags.ptr, counters.ptr, lc.ptr}, nullptr);
      launch_moe_gate_up_fused(experts.t, xn.ptr, ids1.ptr, K, act1.ptr, nullptr);
      // Folded: the o-proj into another buffer, the router from h and a, gate/up ranking and
      // normalising itself.
      DeviceBuffer<float> folded(static_cast<std::size_t>(E) * (H + Q)), x2(static_cast<std::size_t>(H)), logits2(static_cast<std::size_t>(E)),
          w2(static_cast<std::size_t>(K)), act2(static_cast<std::size_t>(K) * I);
      DeviceBuffer<int32_t> ids2(static_cast<std::size_t>(K));
      const TestSync sync(1);
      const unsigned int heads = static_cast<unsigned int>(n_heads);
      CUDA_CHECK(cudaMemcpy(sync.words.ptr + 1, &heads, sizeof heads, cudaMemcpyHostToDevice));
      fold_router_weights(R.ptr, nw.ptr, Wo.ptr, folded.ptr, E, H, Q, nullptr);
      x2.poison();
      w2.poison();
      act2.poison();
      ids2.poison();
      launch_gemv_bf16_pdl(Wo.ptr, a.ptr, x2.ptr, H, Q, true, nullptr, false, h.ptr);
      launch_router_folded(folded.ptr, h.ptr, a.ptr, E, H, Q, logits2.ptr, sync.layer(0), n_heads, nullptr);
      launch_moe_gate_up_normed(experts.t, x2.ptr, nw.ptr, 1e-6f, E, K, renorm,
                                RouterOutputs{logits2.ptr, ids2.ptr, w2.ptr, nullptr, flags.ptr, counters.ptr, lc.ptr}, sync.layer(0),
                                act2.ptr, nullptr);
      const auto xv = x2.get();
      CHECK(xv == x1.get());  // the o-proj into another buffer: the same sums
      CHECK(ids2.get() == ids1.get());
      CHECK(done.get()[0] == 0u);
      CHECK(sync.get() == std::vector<unsigned int>{0u, heads, static_cast<unsigned int>(E)});  // one step's logits counted
      CHECK(counters.get()[0] == 2ull * K);  // every expert hot here: both routings counted
      const auto lcv = lc.get();
      for (int32_t e : ids1.get()) CHECK(lcv[static_cast<std::size_t>(e)] == 2ull);
      double ss = 0;
      for (float v : xv) ss += static_cast<double>(v) * v;
      const double rms = std::sqrt(ss / H + 1e-6);
      std::vector<float> scaled = logits2.get();
      for (float& v : scaled) v = static_cast<float>(v / rms);
      CHECK(gpu_test::compare(logits1.get(), scaled, "folded logits / rms") < 1e-5);
      CHECK(gpu_test::compare(w1.get(), w2.get(), "routing weights") < 1e-5);
      CHECK(gpu_test::compare(act1.get(), act2.get(), "act") < 1e-5);
    }
  }
}

TEST_CASE("the folded layers' handshakes over steps: PDL on or off, bit-identical, counters at epoch times n") {
  gpu_test::skip_without_gpu();
  // Three layers of o-proj -> folded router -> gate/up -> down per step, four steps in one stream,
  // each step ended by the argmax that advances the epoch (as the decode step's last kernel).
  // Each layer its own attention output, so that each routes to other experts: stale ids or a
  // count passed on an earlier step's value would change the result. The heads' counts (H2) are
  // set to each step's target before the step (no attention runs here). act, the residual and
  // the ids must be the same with and without PDL, and every count epoch · n after.
  for (auto [E, K, H, Q, I] : {std::tuple{128, 8, 2048, 4096, 768}, std::tuple{16, 4, 256, 512, 96}}) {
    CAPTURE(E);
    const int n_heads = Q / 128, layers = 3, steps = 4;
    const unsigned s = static_cast<unsigned>(97 + H);
    DeviceBuffer<__nv_bfloat16> Wo(rand_bf16(static_cast<std::size_t>(H) * Q, s, 0.02f)), R(rand_bf16(static_cast<std::size_t>(E) * H, s + 1, 0.2f)),
        nw(rand_bf16(static_cast<std::size_t>(H), s + 2, 1.f));
    DeviceBuffer<float> h(gpu_test::random_floats(static_cast<std::size_t>(H), s + 3, 1.f)),
        a(gpu_test::random_floats(layers * static_cast<std::size_t>(Q), s + 4, 1.f)), folded(static_cast<std::size_t>(E) * (H + Q));
    const DeviceExperts experts(E, H, I, s + 5);
    fold_router_weights(R.ptr, nw.ptr, Wo.ptr, folded.ptr, E, H, Q, nullptr);
    DeviceBuffer<uint8_t> flags(std::vector<uint8_t>(static_cast<std::size_t>(E), 0));
    cudaStream_t st = nullptr;
    REQUIRE(cudaStreamCreate(&st) == cudaSuccess);  // blocking: ordered after the buffers' set-up
    auto chain = [&](bool pdl) {
      DeviceBuffer<unsigned long long> counters(std::vector<unsigned long long>{0, 0}), lc(std::vector<unsigned long long>(static_cast<std::size_t>(E), 0));
      DeviceBuffer<float> x(static_cast<std::size_t>(H)), logits(static_cast<std::size_t>(E)), w(static_cast<std::size_t>(K)),
          act(static_cast<std::size_t>(K) * I), row(std::vector<float>(64, 1.f));
      DeviceBuffer<int32_t> ids(static_cast<std::size_t>(K)), pick(1);
      DeviceBuffer<float> am_v(k_argmax_blocks);
      DeviceBuffer<int32_t> am_i(k_argmax_blocks);
      DeviceBuffer<unsigned int> am_c(std::vector<unsigned int>{0u});
      TestSync sync(layers);
      act.poison();
      const RouterOutputs ro{logits.ptr, ids.ptr, w.ptr, nullptr, flags.ptr, counters.ptr, lc.ptr};
      std::vector<std::vector<float>> xs;
      for (int step = 0; step < steps; ++step) {
        const std::vector<unsigned int> heads(static_cast<std::size_t>(layers), static_cast<unsigned int>(n_heads * (step + 1)));
        REQUIRE(cudaMemcpyAsync(sync.words.ptr + 1, heads.data(), heads.size() * sizeof(unsigned int), cudaMemcpyHostToDevice, st) ==
                cudaSuccess);
        CUDA_CHECK(cudaMemcpyAsync(x.ptr, h.ptr, static_cast<std::size_t>(H) * sizeof(float), cudaMemcpyDeviceToDevice, st));
        for (int layer = 0; layer < layers; ++layer) {
          const float* al = a.ptr + static_cast<std::size_t>(layer) * Q;
          launch_gemv_bf16_pdl(Wo.ptr, al, x.ptr, H, Q, true, st, pdl, h.ptr, true);
          launch_router_folded(folded.ptr, h.ptr, al, E, H, Q, logits.ptr, sync.layer(layer), n_heads, st, pdl);
          launch_moe_gate_up_normed(experts.t, x.ptr, nw.ptr, 1e-6f, E, K, true, ro, sync.layer(layer), act.ptr, st, pdl);
          launch_moe_down_fused(experts.t, act.ptr, ids.ptr, w.ptr, K, x.ptr, st, pdl);
        }
        launch_argmax_row(row.ptr, 64, ArgmaxScratch{am_v.ptr, am_i.ptr, am_c.ptr}, pick.ptr, st, pdl, sync.words.ptr);
        REQUIRE(cudaStreamSynchronize(st) == cudaSuccess);
        xs.push_back(x.get());
      }
      std::vector<unsigned int> want(1 + 2 * static_cast<std::size_t>(layers), static_cast<unsigned int>(E * steps));
      want[0] = steps;
      for (int l = 0; l < layers; ++l) want[1 + static_cast<std::size_t>(l)] = static_cast<unsigned int>(n_heads * steps);
      CHECK(sync.get() == want);
      CHECK(counters.get()[1] == static_cast<unsigned long long>(steps * layers * K));  // every expert cold here
      for (int step = 1; step < steps; ++step) CHECK(xs[static_cast<std::size_t>(step)] == xs[0]);  // every step recomputes the same
      return std::tuple{xs.back(), act.get(), ids.get()};
    };
    const auto want = chain(false);
    CHECK(chain(true) == want);
    CHECK(chain(true) == want);
    cudaStreamDestroy(st);
  }
}

TEST_CASE("argmax on the device picks worker::argmax's token: ties, NaN, -inf, short and odd rows") {
  gpu_test::skip_without_gpu();
  DeviceBuffer<float> vals(std::vector<float>(k_argmax_blocks, 0.f));
  DeviceBuffer<int32_t> idx(std::vector<int32_t>(k_argmax_blocks, 0)), out(std::vector<int32_t>{-1});
  DeviceBuffer<unsigned int> counter(std::vector<unsigned int>{0u});
  const ArgmaxScratch scratch{vals.ptr, idx.ptr, counter.ptr};
  const float nan = std::nanf(""), inf = INFINITY;
  std::vector<std::pair<std::string, std::vector<float>>> rows;
  auto big = gpu_test::random_floats(151936, 91, 10.f);
  rows.emplace_back("vocab row", big);
  big[151935] = 50.f;
  rows.emplace_back("max at the last index", big);
  big[777] = 50.f;
  big[150000] = 50.f;
  rows.emplace_back("three-way tie: the lowest index", big);
  big[5] = nan;
  big[6] = inf;
  rows.emplace_back("NaN and +inf", big);
  big[0] = nan;
  rows.emplace_back("NaN at index 0", big);
  rows.emplace_back("all NaN", std::vector<float>(4099, nan));
  rows.emplace_back("all -inf", std::vector<float>(1000, -inf));
  std::vector<float> neg(1001, -inf);
  neg[1000] = -1e30f;
  rows.emplace_back("one finite at the end", neg);
  for (int n : {1, 2, 3, 5, 7, 255, 257}) rows.emplace_back("short row " + std::to_string(n), gpu_test::random_floats(static_cast<std::size_t>(n), 92 + n, 1.f));
  std::vector<float> zeros(300, -1.f);
  zeros[100] = -0.f;
  zeros[200] = 0.f;
  rows.emplace_back("-0 then +0: they tie, the lower index wins", zeros);
  zeros[100] = 0.f;
  zeros[200] = -0.f;
  rows.emplace_back("+0 then -0", zeros);
  // Ties inside one block's slice (151936 / 64 blocks: 2376 floats each): in one float4 of one
  // thread, and with the lower index in a higher thread (thread t reads the float4s at 4 t,
  // 4 t + 1024, ...: index 5 is thread 1's, index 1025 thread 0's second).
  std::vector<float> tie(151936, 0.f);
  tie[2] = tie[3] = 7.f;
  rows.emplace_back("tie inside one float4", tie);
  std::vector<float> tie2(151936, 0.f);
  tie2[1025] = tie2[5] = 7.f;
  rows.emplace_back("tie across threads of one block, lower index in the higher thread", tie2);
  for (const auto& [name, row] : rows) {
    for (const bool pdl : {false, true}) {
      DeviceBuffer<float> x(row);
      launch_argmax_row(x.ptr, static_cast<int>(row.size()), scratch, out.ptr, nullptr, pdl);
      CHECK_MESSAGE(out.get()[0] == servedeck::worker::argmax(row), name, pdl ? " (pdl)" : "");
      CHECK(counter.get()[0] == 0u);
    }
    // As the decode step's last kernel: the epoch advanced by exactly one per launch.
    DeviceBuffer<float> x(row);
    DeviceBuffer<unsigned int> epoch(std::vector<unsigned int>{41u});
    launch_argmax_row(x.ptr, static_cast<int>(row.size()), scratch, out.ptr, nullptr, true, epoch.ptr);
    CHECK(epoch.get()[0] == 42u);
  }
  CHECK(servedeck::worker::argmax(rows[rows.size() - 1].second) == 5);  // the cases test what they say
  CHECK(servedeck::worker::argmax(rows[rows.size() - 2].second) == 2);
  CHECK(servedeck::worker::argmax(rows[rows.size() - 3].second) == 100);
  DeviceBuffer<float> x(std::vector<float>(8, 1.f));
  CHECK_THROWS_AS(launch_argmax_row(x.ptr, 0, scratch, out.ptr, nullptr), std::invalid_argument);
  CHECK_THROWS_AS(launch_argmax_row(x.ptr + 1, 7, scratch, out.ptr, nullptr), std::invalid_argument);
}
