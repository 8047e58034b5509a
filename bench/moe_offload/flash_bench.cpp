// The flash prefill attention kernel alone (see flash_bench.hpp).
#include "bench/moe_offload/flash_bench.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "worker/cuda/cuda_check.hpp"
#include "worker/cuda/flash_attention.cuh"

namespace servedeck::bench {

namespace cuda = servedeck::worker::cuda;

namespace {

constexpr int heads = 32, kv_heads = 4, hd = 128, q_dim = heads * hd, kv_dim = kv_heads * hd, ldq = q_dim + 2 * kv_dim;
constexpr int token_counts[] = {512, 4096, 16384};
constexpr int n_sizes = static_cast<int>(sizeof(token_counts) / sizeof(token_counts[0]));

/// Median ms of 3 timed launches of `kernel` after a warm-up, on buffers for n tokens.
double time_kernel(cuda::FlashKernel kernel, int n, const float* q, const __nv_bfloat16* k, const __nv_bfloat16* v, float* out) {
  cudaEvent_t a, b;
  CUDA_CHECK(cudaEventCreate(&a));
  CUDA_CHECK(cudaEventCreate(&b));
  cuda::launch_flash_attention_prefill(q, ldq, k, v, out, q_dim, n, 0, heads, kv_heads, hd, nullptr, kernel);  // warm-up
  std::vector<double> ms;
  for (int r = 0; r < 3; ++r) {
    CUDA_CHECK(cudaEventRecord(a));
    cuda::launch_flash_attention_prefill(q, ldq, k, v, out, q_dim, n, 0, heads, kv_heads, hd, nullptr, kernel);
    CUDA_CHECK(cudaEventRecord(b));
    CUDA_CHECK(cudaEventSynchronize(b));
    float t = 0;
    CUDA_CHECK(cudaEventElapsedTime(&t, a, b));
    ms.push_back(t);
  }
  CUDA_CHECK(cudaEventDestroy(a));
  CUDA_CHECK(cudaEventDestroy(b));
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

double tflops(int n, double ms) {
  const double flops = 4.0 * hd * heads * (static_cast<double>(n) * (n + 1) / 2);
  return flops / (ms * 1e-3) / 1e12;
}

}  // namespace

void flash_attention_bench() {
  // One set of buffers for the largest size: a smaller n uses its first n rows (q, k, v, out).
  constexpr int n_max = token_counts[n_sizes - 1];
  const std::size_t nq = static_cast<std::size_t>(n_max) * ldq, nkv = static_cast<std::size_t>(n_max) * kv_dim;
  float *q = nullptr, *out = nullptr;
  __nv_bfloat16 *k = nullptr, *v = nullptr;
  CUDA_CHECK(cudaMalloc(&q, nq * 4));
  CUDA_CHECK(cudaMalloc(&k, nkv * 2));
  CUDA_CHECK(cudaMalloc(&v, nkv * 2));
  CUDA_CHECK(cudaMalloc(&out, static_cast<std::size_t>(n_max) * q_dim * 4));
  CUDA_CHECK(cudaMemset(q, 0x3c, nq * 4));  // fp32 ≈ 0.0115 everywhere: finite
  CUDA_CHECK(cudaMemset(k, 0x3c, nkv * 2));  // bf16 0x3c3c ≈ 0.0115
  CUDA_CHECK(cudaMemset(v, 0x3c, nkv * 2));
  const cuda::FlashKernel chosen = cuda::flash_kernel_for(heads, kv_heads, hd);
  double base_ms[n_sizes] = {};
  for (const cuda::FlashKernel kernel : {cuda::FlashKernel::mma, cuda::FlashKernel::mma_two_blocks, cuda::FlashKernel::wgmma}) {
    const bool first = kernel == cuda::FlashKernel::mma;
    std::printf("\nflash prefill attention kernel %s%s (one layer, 32/4 heads of 128; bf16, fp32 accumulation)\n", cuda::to_string(kernel),
                kernel == chosen ? ", the prefill path's" : "");
    if (!cuda::flash_kernel_runs(kernel, heads, kv_heads, hd)) {
      std::printf("(does not run here: %s)\n", kernel == cuda::FlashKernel::wgmma ? "no sm_90a code for this device, or its shared memory"
                                                                                 : "its shared memory does not fit the block");
      continue;
    }
    if (first) std::printf("%7s %10s %10s\n", "tokens", "ms", "TFLOP/s");
    else std::printf("%7s %10s %10s %12s\n", "tokens", "ms", "TFLOP/s", "vs mma");
    std::fflush(stdout);
    for (int si = 0; si < n_sizes; ++si) {
      const int n = token_counts[si];
      const double ms = time_kernel(kernel, n, q, k, v, out);
      if (first) {
        base_ms[si] = ms;
        std::printf("%7d %10.3f %10.1f\n", n, ms, tflops(n, ms));
      } else {
        std::printf("%7d %10.3f %10.1f %11.3fx\n", n, ms, tflops(n, ms), base_ms[si] / ms);
      }
      std::fflush(stdout);
    }
  }
  CUDA_CHECK(cudaFree(q));
  CUDA_CHECK(cudaFree(out));
  CUDA_CHECK(cudaFree(k));
  CUDA_CHECK(cudaFree(v));
}

}  // namespace servedeck::bench
