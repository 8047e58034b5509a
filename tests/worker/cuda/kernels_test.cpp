// Every decode kernel against a CPU reference in double precision, on fresh random inputs, with
// poisoned outputs. Tolerances: fp32 arithmetic on bf16 weights → relative L2 error < 1e-5 for
// reductions of a few thousand terms (the weights are exactly representable; only the fp32
// accumulation order differs).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <stdexcept>

#include "tests/worker/cuda/gpu_test_support.hpp"
#include "worker/cuda/fused.cuh"
#include "worker/cuda/kernels.cuh"
#include "worker/engine/sampler.hpp"
#include "worker/cuda/prefill.cuh"

using namespace servedeck::worker::cuda;
using gpu_test::DeviceBuffer;

namespace {
std::vector<double> gemv_ref(const std::vector<float>& W, const std::vector<float>& x, int out, int in) {
  std::vector<double> y(static_cast<std::size_t>(out));
  for (int r = 0; r < out; ++r) {
    double acc = 0;
    for (int c = 0; c < in; ++c) acc += static_cast<double>(W[static_cast<std::size_t>(r) * in + c]) * x[static_cast<std::size_t>(c)];
    y[static_cast<std::size_t>(r)] = acc;
  }
  return y;
}
std::vector<float> to_float(const std::vector<double>& v) { return std::vector<float>(v.begin(), v.end()); }
}  // namespace

TEST_CASE("gemv_bf16 matches the CPU reference from VRAM and from pinned host memory (UVA)") {
  gpu_test::skip_without_gpu();
  for (auto [out, in] : {std::pair{37, 8}, std::pair{256, 2048}, std::pair{2048, 768}, std::pair{1000, 4096}}) {
    auto Wf = gpu_test::from_bf16(gpu_test::to_bf16(gpu_test::random_floats(static_cast<std::size_t>(out) * in, 1 + out)));
    auto x = gpu_test::random_floats(static_cast<std::size_t>(in), 2 + in);
    auto want = to_float(gemv_ref(Wf, x, out, in));
    DeviceBuffer<__nv_bfloat16> W(gpu_test::to_bf16(Wf));
    DeviceBuffer<float> dx(x), y(static_cast<std::size_t>(out));
    y.poison();
    launch_gemv_bf16(W.ptr, dx.ptr, y.ptr, out, in, false, nullptr);
    CHECK(gpu_test::compare(want, y.get(), "gemv vram") < 1e-5);

    // The same weights read over PCIe through a mapped pinned allocation.
    __nv_bfloat16* host = nullptr;
    CUDA_CHECK(cudaHostAlloc(&host, W.n * sizeof(__nv_bfloat16), cudaHostAllocMapped));
    auto Wb = gpu_test::to_bf16(Wf);
    std::copy(Wb.begin(), Wb.end(), host);
    __nv_bfloat16* uva = nullptr;
    CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&uva), host, 0));
    y.poison();
    launch_gemv_bf16(uva, dx.ptr, y.ptr, out, in, false, nullptr);
    CHECK(gpu_test::compare(want, y.get(), "gemv uva") < 1e-5);
    CUDA_CHECK(cudaFreeHost(host));
  }
  // Precondition: a row that is not a multiple of 8 elements is refused with both values.
  DeviceBuffer<__nv_bfloat16> W(16);
  DeviceBuffer<float> x(16), y(2);
  CHECK_THROWS_WITH_AS(launch_gemv_bf16(W.ptr, x.ptr, y.ptr, 2, 7, false, nullptr),
                       "launch_gemv_bf16: in must be a multiple of 8 (16-byte rows), got 7", std::invalid_argument);
}

TEST_CASE("rmsnorm, rope and router top-k match the CPU reference") {
  gpu_test::skip_without_gpu();
  const int rows = 4, dim = 128;
  auto x = gpu_test::random_floats(rows * dim, 11, 3.f);
  auto w = gpu_test::from_bf16(gpu_test::to_bf16(gpu_test::random_floats(dim, 12)));
  std::vector<float> want(x.size());
  for (int r = 0; r < rows; ++r) {
    double ss = 0;
    for (int i = 0; i < dim; ++i) ss += static_cast<double>(x[r * dim + i]) * x[r * dim + i];
    const double inv = 1.0 / std::sqrt(ss / dim + 1e-6);
    for (int i = 0; i < dim; ++i) want[r * dim + i] = static_cast<float>(x[r * dim + i] * inv * w[i]);
  }
  DeviceBuffer<float> dx(x), dy(x.size());
  DeviceBuffer<__nv_bfloat16> dw(gpu_test::to_bf16(w));
  dy.poison();
  launch_rmsnorm(dx.ptr, dw.ptr, dy.ptr, rows, dim, 1e-6f, nullptr);
  CHECK(gpu_test::compare(want, dy.get(), "rmsnorm") < 1e-6);

  // RoPE at position 1234 on 4 query heads and 2 KV heads of 64 (rotate_half convention).
  const int hq = 4, hk = 2, hd = 64, pos = 1234;
  auto q = gpu_test::random_floats(hq * hd, 13), k = gpu_test::random_floats(hk * hd, 14);
  auto rope_ref = [&](std::vector<float> v, int heads) {
    for (int h = 0; h < heads; ++h)
      for (int i = 0; i < hd / 2; ++i) {
        const float expo = static_cast<float>(2 * i) / static_cast<float>(hd);
        const double angle = static_cast<double>(static_cast<float>(pos) * (1.0f / static_cast<float>(std::pow(1e6, expo))));
        const double a = v[h * hd + i], b = v[h * hd + i + hd / 2];
        v[h * hd + i] = static_cast<float>(a * std::cos(angle) - b * std::sin(angle));
        v[h * hd + i + hd / 2] = static_cast<float>(b * std::cos(angle) + a * std::sin(angle));
      }
    return v;
  };
  DeviceBuffer<float> dq(q), dk(k);
  DeviceBuffer<int32_t> dpos(std::vector<int32_t>{pos});
  launch_rope(dq.ptr, dk.ptr, hq, hk, hd, hd, dpos.ptr, 1e6f, nullptr);
  CHECK(gpu_test::compare(rope_ref(q, hq), dq.get(), "rope q", 1e-3) < 1e-4);
  CHECK(gpu_test::compare(rope_ref(k, hk), dk.get(), "rope k", 1e-3) < 1e-4);

  // Router: 128 experts, top-8, renormalised.
  auto logits = gpu_test::random_floats(128, 15, 4.f);
  std::vector<int> order(128);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return logits[a] > logits[b]; });
  double denom = 0;
  for (int i = 0; i < 8; ++i) denom += std::exp(static_cast<double>(logits[order[i]]));
  DeviceBuffer<float> dl(logits), dwts(8);
  DeviceBuffer<int32_t> dids(8);
  launch_router_topk(dl.ptr, 128, 8, true, dids.ptr, dwts.ptr, nullptr);
  auto ids = dids.get();
  auto wts = dwts.get();
  for (int i = 0; i < 8; ++i) {
    CHECK(ids[i] == order[i]);
    CHECK(wts[i] == doctest::Approx(std::exp(static_cast<double>(logits[order[i]])) / denom).epsilon(1e-5));
  }
}

TEST_CASE("the decode step's top-k by rank, split over 256 threads or not: ties, NaN and -inf as the CPU rule") {
  gpu_test::skip_without_gpu();
  // The rule: descending value, NaN as -inf, ties to the lower id (a stable sort).
  auto ranked = [](std::vector<float> v) {
    for (float& x : v)
      if (std::isnan(x)) x = -INFINITY;
    return v;
  };
  auto want = [](const std::vector<float>& v, int k) {
    std::vector<int> order(v.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return v[static_cast<std::size_t>(a)] > v[static_cast<std::size_t>(b)]; });
    order.resize(static_cast<std::size_t>(k));
    return order;
  };
  // A float's bits: the values picked must match bit for bit (-0 and +0 told apart).
  auto bits = [](float f) {
    uint32_t u = 0;
    std::memcpy(&u, &f, sizeof u);
    return u;
  };
  // n = 128 (the benchmark), 64 and 8 (the split path), 24 and 256 (not split: n % 8 or 2n > 256).
  for (const int n : {128, 64, 8, 24, 256}) {
    for (const int variant : {0, 1, 2}) {
      CAPTURE(n);
      CAPTURE(variant);
      auto v = gpu_test::random_floats(static_cast<std::size_t>(n), static_cast<unsigned>(40 + n + variant), 2.f);
      if (variant >= 1)  // ties: every value rounded to a quarter, so many repeat
        for (float& x : v) x = std::round(x * 4.f) / 4.f;
      if (variant == 2) {  // NaN, -inf, +inf and signed zeros among them
        v[1] = std::nanf("");
        v[static_cast<std::size_t>(n) / 2] = -INFINITY;
        v[static_cast<std::size_t>(n) - 1] = INFINITY;
        v[0] = 0.f;
        v[2 % static_cast<std::size_t>(n)] = -0.f;
      }
      const int k = std::min(n, 8);
      const auto vr = ranked(v);
      const auto order = want(vr, k);
      DeviceBuffer<float> dv(v);
      for (const bool split : {true, false}) {
        CAPTURE(split);
        DeviceBuffer<int32_t> ids(static_cast<std::size_t>(k));
        DeviceBuffer<float> vals(static_cast<std::size_t>(k));
        ids.poison();
        vals.poison();
        launch_block_topk_by_rank(dv.ptr, n, k, split, ids.ptr, vals.ptr, nullptr);
        const auto got = ids.get();
        const auto got_v = vals.get();
        for (int r = 0; r < k; ++r) {
          CAPTURE(r);
          const int e = order[static_cast<std::size_t>(r)];
          CHECK(got[static_cast<std::size_t>(r)] == e);
          CHECK(bits(got_v[static_cast<std::size_t>(r)]) == bits(vr[static_cast<std::size_t>(e)]));  // NaN reported as -inf
        }
      }
    }
  }
  DeviceBuffer<float> dv(std::vector<float>(8, 0.f));
  DeviceBuffer<int32_t> ids(8);
  DeviceBuffer<float> vals(8);
  CHECK_THROWS_AS(launch_block_topk_by_rank(dv.ptr, 8, 9, true, ids.ptr, vals.ptr, nullptr), std::invalid_argument);
}

TEST_CASE("attention decode (GQA) matches the CPU reference") {
  gpu_test::skip_without_gpu();
  const int hq = 8, hk = 2, hd = 128, len = 300, cap = 512, kv_dim = hk * hd;
  auto q = gpu_test::random_floats(hq * hd, 21);
  auto kc = gpu_test::random_floats(static_cast<std::size_t>(cap) * kv_dim, 22);
  auto vc = gpu_test::random_floats(static_cast<std::size_t>(cap) * kv_dim, 23);
  std::vector<float> want(hq * hd);
  for (int h = 0; h < hq; ++h) {
    const int g = h / (hq / hk);
    std::vector<double> s(len);
    double m = -1e300;
    for (int t = 0; t < len; ++t) {
      double acc = 0;
      for (int d = 0; d < hd; ++d) acc += static_cast<double>(q[h * hd + d]) * kc[static_cast<std::size_t>(t) * kv_dim + g * hd + d];
      s[t] = acc / std::sqrt(static_cast<double>(hd));
      m = std::max(m, s[t]);
    }
    double sum = 0;
    for (auto& v : s) sum += (v = std::exp(v - m));
    for (int d = 0; d < hd; ++d) {
      double acc = 0;
      for (int t = 0; t < len; ++t) acc += s[t] * vc[static_cast<std::size_t>(t) * kv_dim + g * hd + d];
      want[h * hd + d] = static_cast<float>(acc / sum);
    }
  }
  DeviceBuffer<float> dq(q), dk(kc), dv(vc), scores(static_cast<std::size_t>(hq) * cap), out(hq * hd);
  DeviceBuffer<int32_t> dpos(std::vector<int32_t>{len - 1});
  out.poison();
  launch_attention_decode(dq.ptr, dk.ptr, dv.ptr, scores.ptr, out.ptr, hq, hk, hd, dpos.ptr, cap, nullptr);
  CHECK(gpu_test::compare(want, out.get(), "attention") < 1e-5);
}

TEST_CASE("MoE decode through a mixed VRAM/UVA pointer table matches the CPU reference") {
  gpu_test::skip_without_gpu();
  const int E = 8, K = 3, H = 256, I = 64;
  const std::size_t block = 3u * I * H;
  std::vector<std::vector<float>> experts;
  for (int e = 0; e < E; ++e) experts.push_back(gpu_test::from_bf16(gpu_test::to_bf16(gpu_test::random_floats(block, 100 + e, 0.1f))));
  auto x = gpu_test::random_floats(H, 31);
  std::vector<int32_t> ids = {5, 1, 6};
  std::vector<float> w = {0.5f, 0.3f, 0.2f};
  std::vector<float> base = gpu_test::random_floats(H, 32);
  std::vector<double> want(base.begin(), base.end());
  for (int j = 0; j < K; ++j) {
    const auto& B = experts[ids[j]];
    std::vector<double> act(I);
    for (int i = 0; i < I; ++i) {
      double g = 0, u = 0;
      for (int c = 0; c < H; ++c) {
        g += static_cast<double>(B[static_cast<std::size_t>(i) * H + c]) * x[c];
        u += static_cast<double>(B[static_cast<std::size_t>(I + i) * H + c]) * x[c];
      }
      act[i] = g / (1 + std::exp(-g)) * u;
    }
    for (int h = 0; h < H; ++h) {
      double acc = 0;
      for (int i = 0; i < I; ++i) acc += static_cast<double>(B[2u * I * H + static_cast<std::size_t>(h) * I + i]) * act[i];
      want[h] += w[j] * acc;
    }
  }
  // Experts 0-3 in VRAM, 4-7 in mapped pinned host memory.
  std::vector<DeviceBuffer<__nv_bfloat16>*> vram;
  std::vector<__nv_bfloat16*> hosts;
  std::vector<const __nv_bfloat16*> table(E);
  for (int e = 0; e < E; ++e) {
    auto b = gpu_test::to_bf16(experts[e]);
    if (e < 4) {
      vram.push_back(new DeviceBuffer<__nv_bfloat16>(b));
      table[e] = vram.back()->ptr;
    } else {
      __nv_bfloat16* h = nullptr;
      CUDA_CHECK(cudaHostAlloc(&h, block * sizeof(__nv_bfloat16), cudaHostAllocMapped));
      std::copy(b.begin(), b.end(), h);
      hosts.push_back(h);
      __nv_bfloat16* d = nullptr;
      CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&d), h, 0));
      table[e] = d;
    }
  }
  DeviceBuffer<const __nv_bfloat16*> dtable(table);
  DeviceBuffer<float> dx(x), dw(w), scratch(static_cast<std::size_t>(K) * 2 * I), partial(static_cast<std::size_t>(K) * H), out(base);
  DeviceBuffer<int32_t> dids(ids);
  launch_moe_decode(ExpertTable{dtable.ptr, H, I}, dx.ptr, dids.ptr, dw.ptr, K, scratch.ptr, partial.ptr, out.ptr, nullptr);
  CHECK(gpu_test::compare(to_float(want), out.get(), "moe") < 1e-5);
  for (auto* b : vram) delete b;
  for (auto* h : hosts) CUDA_CHECK(cudaFreeHost(h));
}

// Prefill router logits: the tiled kernel (>= 64 rows; 150 rows and 160 experts leave partial
// tiles on both axes) and the per-row kernel (10 rows), against double precision.
TEST_CASE("router logits for rows (tiled and per-row) match the CPU reference") {
  gpu_test::skip_without_gpu();
  constexpr int E = 160, H = 256;
  const auto R = gpu_test::from_bf16(gpu_test::to_bf16(gpu_test::random_floats(static_cast<std::size_t>(E) * H, 31)));
  DeviceBuffer<__nv_bfloat16> dR(gpu_test::to_bf16(R));
  for (const int rows : {150, 10}) {
    CAPTURE(rows);
    const auto x = gpu_test::random_floats(static_cast<std::size_t>(rows) * H, 32 + rows, 2.f);
    DeviceBuffer<float> dx(x), out(static_cast<std::size_t>(rows) * E);
    out.poison();
    launch_router_logits_rows(dR.ptr, dx.ptr, out.ptr, rows, E, H, nullptr);
    std::vector<float> want;
    for (int t = 0; t < rows; ++t) {
      const auto y = gemv_ref(R, std::vector<float>(x.begin() + static_cast<std::ptrdiff_t>(t) * H, x.begin() + static_cast<std::ptrdiff_t>(t + 1) * H), E, H);
      want.insert(want.end(), y.begin(), y.end());
    }
    CHECK(gpu_test::compare(want, out.get(), "router logits rows", 1e-4) < 1e-5);
  }
}

// The prefill's MoE row scatter against the host's stable counting sort, with rank and offset in
// mapped pinned memory (as the prefill path passes them) and experts in a non-identity order.
TEST_CASE("moe scatter rows: the stable expert order from host ranks and offsets in mapped memory") {
  gpu_test::skip_without_gpu();
  constexpr int E = 37, K = 3, T = 500, rows = T * K;
  std::vector<int32_t> ids(rows);
  for (int p = 0; p < rows; ++p) ids[static_cast<std::size_t>(p)] = (p * 7919 + p / 5) % E;
  std::vector<int> order(E);
  std::iota(order.begin(), order.end(), 0);
  std::reverse(order.begin(), order.end());  // compute order: highest id first
  int32_t *rank = nullptr, *offset = nullptr, *rank_dev = nullptr, *offset_dev = nullptr;
  CUDA_CHECK(cudaHostAlloc(&rank, rows * sizeof(int32_t), cudaHostAllocMapped));
  CUDA_CHECK(cudaHostAlloc(&offset, E * sizeof(int32_t), cudaHostAllocMapped));
  CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&rank_dev), rank, 0));
  CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&offset_dev), offset, 0));
  std::vector<int> count(E, 0);
  for (int p = 0; p < rows; ++p) rank[p] = count[static_cast<std::size_t>(ids[static_cast<std::size_t>(p)])]++;
  int at = 0;
  for (const int e : order) {
    offset[e] = at;
    at += count[static_cast<std::size_t>(e)];
  }
  // Reference: the host's stable sort (what the prefill path computed before the kernel).
  std::vector<int32_t> want_src(rows), want_slot(rows);
  std::vector<int> fill(offset, offset + E);
  for (int p = 0; p < rows; ++p) {
    const int a = fill[static_cast<std::size_t>(ids[static_cast<std::size_t>(p)])]++;
    want_src[static_cast<std::size_t>(a)] = p / K;
    want_slot[static_cast<std::size_t>(p)] = a;
  }
  DeviceBuffer<int32_t> dids(ids), slot(static_cast<std::size_t>(rows)), src(static_cast<std::size_t>(rows));
  slot.poison();
  src.poison();
  launch_moe_scatter_rows(dids.ptr, rank_dev, offset_dev, rows, K, E, slot.ptr, src.ptr, nullptr);
  CHECK(slot.get() == want_slot);
  CHECK(src.get() == want_src);
  CHECK_THROWS_AS(launch_moe_scatter_rows(dids.ptr, rank_dev, offset_dev, rows, K, 5000, slot.ptr, src.ptr, nullptr), std::invalid_argument);
  CUDA_CHECK(cudaFreeHost(rank));
  CUDA_CHECK(cudaFreeHost(offset));
}

// The device's top-k selection against the sampler's own (top_logits): the same (logit, id)
// pairs in the same order, bit for bit, on rows with ties, NaN, ±inf, and fewer finite logits
// than k; at slice boundaries (4096) and Qwen3's vocabulary.
TEST_CASE("launch_top_k_row selects top_logits' candidates: ties, NaN, inf, short rows, Qwen3's vocabulary") {
  gpu_test::skip_without_gpu();
  using servedeck::worker::cuda::TopKOut;
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  int checked = 0;
  for (const int n : {1, 7, 100, 4096, 4097, 20000, 151936}) {
    for (int variant = 0; variant < 4; ++variant) {
      auto row = gpu_test::random_floats(static_cast<std::size_t>(n), 1000 + n + variant, 4.f);
      if (variant == 1)  // many exact ties: values on a grid of 0.5
        for (auto& v : row) v = std::round(v * 2.f) / 2.f;
      if (variant == 2)  // non-finite values, a -0.0 and a +0.0
        for (int i = 0; i < n; i += 3) row[static_cast<std::size_t>(i)] = i % 2 ? nan : (i % 9 ? inf : -inf);
      if (variant == 3) {  // only a few finite values
        for (auto& v : row) v = nan;
        for (int i = 0; i < n; i += 997) row[static_cast<std::size_t>(i)] = static_cast<float>(i % 5) - 2.f;
        row[0] = -0.0f;
      }
      gpu_test::DeviceBuffer<float> x(row);
      gpu_test::DeviceBuffer<unsigned long long> partial(static_cast<std::size_t>(servedeck::worker::cuda::top_k_blocks(n)) * 64);
      gpu_test::DeviceBuffer<float> logits(64);
      gpu_test::DeviceBuffer<int32_t> ids(64);
      gpu_test::DeviceBuffer<int> count(1);
      for (const int k : {1, 2, 20, 64}) {
        CAPTURE(n);
        CAPTURE(variant);
        CAPTURE(k);
        servedeck::worker::cuda::launch_top_k_row(x.ptr, n, k, partial.ptr, TopKOut{logits.ptr, ids.ptr, count.ptr}, nullptr);
        REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
        const auto want = servedeck::worker::top_logits(row, static_cast<std::size_t>(k));
        const int got_n = count.get()[0];
        REQUIRE(got_n == static_cast<int>(want.size()));
        const auto gl = logits.get();
        const auto gi = ids.get();
        for (int i = 0; i < got_n; ++i) {
          CHECK(std::memcmp(&gl[static_cast<std::size_t>(i)], &want[static_cast<std::size_t>(i)].first, 4) == 0);
          CHECK(gi[static_cast<std::size_t>(i)] == want[static_cast<std::size_t>(i)].second);
        }
        ++checked;
      }
    }
  }
  CHECK(checked == 7 * 4 * 4);
  CHECK_THROWS_AS(servedeck::worker::cuda::launch_top_k_row(nullptr, 10, 65, nullptr, TopKOut{}, nullptr), std::invalid_argument);
  CHECK_THROWS_AS(servedeck::worker::cuda::launch_top_k_row(nullptr, 0, 5, nullptr, TopKOut{}, nullptr), std::invalid_argument);
}
