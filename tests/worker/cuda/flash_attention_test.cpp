// The flash prefill attention kernel (flash_attention.cuh) against a double-precision CPU
// reference of causal GQA attention over a KV cache, on random inputs with poisoned outputs.
// The kernel computes in bf16 (flash_attention.cuh): the reference takes the same bf16-rounded q,
// k and v, so what remains is the kernel's own rounding — the probabilities in bf16 (relative
// 2^-9) and fp32 accumulation — and the output (a weighted mean of v in [-1, 1]) may be off by
// ~1e-3: relative L2 < 3e-3, max |error| < 5e-3. A second case states how far bf16 inputs move
// the output from fp32 attention (the price of bf16 numerics, not a kernel error). Shapes cover
// head_dim 32/64/128, groups 1/4/8 and the groups split over several blocks per KV head, 12
// (GLM-4.5-Air's 96 / 8; wgmma 3 × 4 heads, the mma kernels 2 × 6) and 16 (2 × 8), chunks not a
// multiple of the 16-query tile, queries after
// an earlier chunk (pos0 > 0) and more than one 64-key tile. Every FlashKernel the device runs
// for the shape (flash_kernel_runs: wgmma needs head_dim 128, a group that is a multiple of 4 and an sm_90a build;
// each needs its shared memory to fit, so under SERVEDECK_CUDA_SMEM_PER_BLOCK=101376 group 8 at
// head_dim 128 runs mma alone, as on a 99 KB card) runs every case with the same tolerances and
// must equal mma within 1e-5 (wgmma adds its products in the tensor core's order; on the H200
// that matched mma bitwise).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#include "tests/worker/cuda/gpu_test_support.hpp"
#include "worker/cuda/flash_attention.cuh"

using namespace servedeck::worker::cuda;
using gpu_test::DeviceBuffer;

namespace {

struct Shape {
  int n_heads, n_kv_heads, hd, n, pos0;
};

/// out (n, n_heads·hd) from q (n, ldq) and caches (pos0 + n, n_kv·hd), in double.
std::vector<float> reference(const Shape& s, const std::vector<float>& q, int ldq, const std::vector<float>& k,
                             const std::vector<float>& v) {
  const int kv_dim = s.n_kv_heads * s.hd, group = s.n_heads / s.n_kv_heads;
  std::vector<float> out(static_cast<std::size_t>(s.n) * s.n_heads * s.hd);
  for (int i = 0; i < s.n; ++i)
    for (int h = 0; h < s.n_heads; ++h) {
      const int kvh = h / group, last = s.pos0 + i;
      std::vector<double> w(static_cast<std::size_t>(last) + 1);
      double mx = -1e300;
      for (int j = 0; j <= last; ++j) {
        double d = 0;
        for (int c = 0; c < s.hd; ++c)
          d += static_cast<double>(q[static_cast<std::size_t>(i) * ldq + h * s.hd + c]) * k[static_cast<std::size_t>(j) * kv_dim + kvh * s.hd + c];
        w[static_cast<std::size_t>(j)] = d / std::sqrt(static_cast<double>(s.hd));
        mx = std::max(mx, w[static_cast<std::size_t>(j)]);
      }
      double sum = 0;
      for (auto& x : w) sum += (x = std::exp(x - mx));
      for (int c = 0; c < s.hd; ++c) {
        double o = 0;
        for (int j = 0; j <= last; ++j) o += w[static_cast<std::size_t>(j)] * v[static_cast<std::size_t>(j) * kv_dim + kvh * s.hd + c];
        out[(static_cast<std::size_t>(i) * s.n_heads + h) * s.hd + c] = static_cast<float>(o / sum);
      }
    }
  return out;
}

}  // namespace

TEST_CASE("flash prefill attention matches a double-precision reference") {
  gpu_test::skip_without_gpu();
  // The last shape: group 8 at head_dim 128 (the served model's), n = 97 not a multiple of 16 or
  // 64, pos0 = 45 so the chunk's keys (142) end inside a third 64-key tile. Shape{8, 2, 128, 40, 20}:
  // group 4 at head_dim 128 (wgmma with one warpgroup per block, wgmma_wide with 64 queries per block).
  MESSAGE("wgmma kernel in this build for this device: "
          << std::string(flash_wgmma_available() ? "yes" : "no (wgmma and wgmma_wide run two_blocks)"));
  for (const Shape s : {Shape{8, 2, 32, 50, 30}, Shape{32, 4, 128, 70, 0}, Shape{4, 4, 64, 17, 100}, Shape{16, 2, 128, 33, 140},
                        Shape{32, 4, 128, 300, 0}, Shape{32, 4, 128, 97, 45}, Shape{8, 2, 128, 40, 20},
                        Shape{24, 2, 128, 97, 45}, Shape{16, 1, 128, 70, 20}, Shape{12, 1, 64, 50, 30}, Shape{24, 2, 32, 33, 0}}) {
    CAPTURE(s.n_heads);
    CAPTURE(s.hd);
    CAPTURE(s.n);
    CAPTURE(s.pos0);
    const int q_dim = s.n_heads * s.hd, kv_dim = s.n_kv_heads * s.hd, ldq = q_dim + 2 * kv_dim, len = s.pos0 + s.n;
    // Queries scaled by 3: peaked enough that the softmax is not near-uniform.
    const auto q = gpu_test::random_floats(static_cast<std::size_t>(s.n) * ldq, 11 + s.hd, 3.f);
    const auto k = gpu_test::random_floats(static_cast<std::size_t>(len + 5) * kv_dim, 12 + s.n, 1.f);
    const auto v = gpu_test::random_floats(static_cast<std::size_t>(len + 5) * kv_dim, 13 + s.pos0, 1.f);
    const auto kb = gpu_test::to_bf16(k), vb = gpu_test::to_bf16(v);
    DeviceBuffer<float> dq(q), out(static_cast<std::size_t>(s.n) * q_dim);
    DeviceBuffer<__nv_bfloat16> dk(kb), dv(vb);
    const auto want = reference(s, gpu_test::from_bf16(gpu_test::to_bf16(q)), ldq, gpu_test::from_bf16(kb), gpu_test::from_bf16(vb));
    const auto want32 = reference(s, q, ldq, k, v);
    std::vector<float> mma_out;
    MESSAGE("kernel for this shape on this device: " << std::string(to_string(flash_kernel_for(s.n_heads, s.n_kv_heads, s.hd))));
    for (const FlashKernel kernel : {FlashKernel::mma, FlashKernel::mma_two_blocks, FlashKernel::wgmma}) {
      CAPTURE(to_string(kernel));
      if (!flash_kernel_runs(kernel, s.n_heads, s.n_kv_heads, s.hd)) {
        CHECK(kernel != FlashKernel::mma);  // mma runs every supported shape on any device we build for
        continue;
      }
      out.poison();
      launch_flash_attention_prefill(dq.ptr, ldq, dk.ptr, dv.ptr, out.ptr, q_dim, s.n, s.pos0, s.n_heads, s.n_kv_heads, s.hd, nullptr,
                                     kernel);
      const auto got = out.get();
      double max_abs = 0;
      for (std::size_t i = 0; i < want.size(); ++i) max_abs = std::max(max_abs, static_cast<double>(std::fabs(got[i] - want[i])));
      const double rel = gpu_test::compare(want, got, "flash attention", 5e-3);
      MESSAGE("flash attention vs reference: relative L2 " << rel << ", max |error| " << max_abs);
      CHECK(rel < 3e-3);
      CHECK(max_abs < 5e-3);
      // Against fp32 inputs: bf16 q, k, v move scores of this spread (|q·k|/sqrt(hd) ~ 1) by ~1e-2.
      const double rel32 = gpu_test::compare(want32, got, "flash attention vs fp32 inputs", 5e-2);
      MESSAGE("flash attention vs fp32 attention: relative L2 " << rel32);
      CHECK(rel32 < 2e-2);
      if (kernel == FlashKernel::mma) {
        mma_out = got;
      } else {
        // mma_two_blocks does mma's arithmetic in the same order; wgmma adds its k steps in the
        // tensor core's order: all held to 1e-5 of mma.
        REQUIRE(mma_out.size() == got.size());
        double max_vs_mma = 0;
        for (std::size_t i = 0; i < got.size(); ++i) max_vs_mma = std::max(max_vs_mma, static_cast<double>(std::fabs(got[i] - mma_out[i])));
        MESSAGE(std::string(to_string(kernel)) << " vs mma: max |difference| " << max_vs_mma);
        CHECK(max_vs_mma < 1e-5);
      }
    }
    // The launcher without a kernel runs flash_kernel_for's: the same output as that kernel's.
    out.poison();
    launch_flash_attention_prefill(dq.ptr, ldq, dk.ptr, dv.ptr, out.ptr, q_dim, s.n, s.pos0, s.n_heads, s.n_kv_heads, s.hd, nullptr);
    const auto by_default = out.get();
    out.poison();
    launch_flash_attention_prefill(dq.ptr, ldq, dk.ptr, dv.ptr, out.ptr, q_dim, s.n, s.pos0, s.n_heads, s.n_kv_heads, s.hd, nullptr,
                                   flash_kernel_for(s.n_heads, s.n_kv_heads, s.hd));
    CHECK(out.get() == by_default);
  }
}

TEST_CASE("flash prefill attention: the kernel choice follows the device and the shape") {
  gpu_test::skip_without_gpu();
  CHECK(std::string(to_string(FlashKernel::mma)) == "mma");
  CHECK(std::string(to_string(FlashKernel::mma_two_blocks)) == "mma_two_blocks");
  CHECK(std::string(to_string(FlashKernel::wgmma)) == "wgmma");
  // wgmma only at head_dim 128 with a group that is a multiple of 4, and only with sm_90a code for this device.
  CHECK_FALSE(flash_kernel_runs(FlashKernel::wgmma, 8, 2, 64));
  CHECK_FALSE(flash_kernel_runs(FlashKernel::wgmma, 16, 8, 128));
  const bool wgmma_here = flash_kernel_runs(FlashKernel::wgmma, 32, 4, 128);
  if (!flash_wgmma_available()) CHECK_FALSE(wgmma_here);  // with sm_90a code it also needs its 129 KB
  CHECK(wgmma_here == (flash_kernel_for(32, 4, 128) == FlashKernel::wgmma));
  CHECK(wgmma_here == (flash_kernel_for(96, 8, 128) == FlashKernel::wgmma));  // group 12: 3 blocks of 4 heads
  CHECK_FALSE(flash_kernel_runs(FlashKernel::wgmma, 20, 2, 128));             // group 10
  CHECK(flash_kernel_runs(FlashKernel::mma, 32, 4, 128));
  CHECK(flash_kernel_for(8, 2, 64) != FlashKernel::wgmma);
  // A kernel that cannot run the shape here is refused, naming it.
  if (!flash_kernel_runs(FlashKernel::wgmma, 32, 4, 128))
    CHECK_THROWS_AS(launch_flash_attention_prefill(nullptr, 4096 + 1024, nullptr, nullptr, nullptr, 4096, 4, 0, 32, 4, 128, nullptr,
                                                   FlashKernel::wgmma),
                    std::invalid_argument);
  CHECK_THROWS_AS(launch_flash_attention_prefill(nullptr, 512, nullptr, nullptr, nullptr, 512, 4, 0, 8, 2, 64, nullptr, FlashKernel::wgmma),
                  std::invalid_argument);
}

TEST_CASE("flash prefill attention refuses shapes it does not handle, naming them") {
  gpu_test::skip_without_gpu();
  CHECK_FALSE(flash_attention_supported(8, 2, 96));
  CHECK_FALSE(flash_attention_supported(34, 2, 128));  // group 17 > 16
  CHECK(flash_attention_supported(32, 2, 128));        // group 16
  CHECK(flash_attention_supported(96, 8, 128));        // group 12
  CHECK(flash_attention_supported(32, 4, 128));
  CHECK_THROWS_WITH_AS(launch_flash_attention_prefill(nullptr, 768, nullptr, nullptr, nullptr, 768, 4, 0, 8, 2, 96, nullptr),
                       "launch_flash_attention_prefill: head_dim must be 32, 64 or 128 and n_heads a multiple of n_kv_heads "
                       "with n_heads / n_kv_heads in [1, 16], got head_dim 96, heads 8 / 2",
                       std::invalid_argument);
  CHECK_THROWS_AS(launch_flash_attention_prefill(nullptr, 512, nullptr, nullptr, nullptr, 512, 0, 0, 8, 2, 32, nullptr),
                  std::invalid_argument);
}
