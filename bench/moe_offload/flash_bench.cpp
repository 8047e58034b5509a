// The flash prefill attention kernel alone (see flash_bench.hpp).
#include "bench/moe_offload/flash_bench.hpp"

#include <algorithm>
#include <cstdio>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "worker/cuda/cuda_check.hpp"
#include "worker/cuda/flash_attention.cuh"

namespace servedeck::bench {

namespace cuda = servedeck::worker::cuda;

void flash_attention_bench() {
  constexpr int heads = 32, kv_heads = 4, hd = 128, q_dim = heads * hd, kv_dim = kv_heads * hd, ldq = q_dim + 2 * kv_dim;
  std::printf("\nflash prefill attention kernel (one layer, 32/4 heads of 128; bf16 mma.sync, fp32 accumulation)\n");
  std::printf("%7s %10s %10s\n", "tokens", "ms", "TFLOP/s");
  for (int n : {512, 4096, 16384}) {
    const std::size_t nq = static_cast<std::size_t>(n) * ldq, nkv = static_cast<std::size_t>(n) * kv_dim;
    float *q = nullptr, *out = nullptr;
    __nv_bfloat16 *k = nullptr, *v = nullptr;
    CUDA_CHECK(cudaMalloc(&q, nq * 4));
    CUDA_CHECK(cudaMalloc(&k, nkv * 2));
    CUDA_CHECK(cudaMalloc(&v, nkv * 2));
    CUDA_CHECK(cudaMalloc(&out, static_cast<std::size_t>(n) * q_dim * 4));
    CUDA_CHECK(cudaMemset(q, 0x3c, nq * 4));  // fp32 ≈ 0.0115 everywhere: finite
    CUDA_CHECK(cudaMemset(k, 0x3c, nkv * 2));  // bf16 0x3c3c ≈ 0.0115
    CUDA_CHECK(cudaMemset(v, 0x3c, nkv * 2));
    cudaEvent_t a, b;
    CUDA_CHECK(cudaEventCreate(&a));
    CUDA_CHECK(cudaEventCreate(&b));
    cuda::launch_flash_attention_prefill(q, ldq, k, v, out, q_dim, n, 0, heads, kv_heads, hd, nullptr);  // warm-up
    std::vector<double> ms;
    for (int r = 0; r < 3; ++r) {
      CUDA_CHECK(cudaEventRecord(a));
      cuda::launch_flash_attention_prefill(q, ldq, k, v, out, q_dim, n, 0, heads, kv_heads, hd, nullptr);
      CUDA_CHECK(cudaEventRecord(b));
      CUDA_CHECK(cudaEventSynchronize(b));
      float t = 0;
      CUDA_CHECK(cudaEventElapsedTime(&t, a, b));
      ms.push_back(t);
    }
    std::sort(ms.begin(), ms.end());
    const double t = ms[ms.size() / 2];
    const double flops = 4.0 * hd * heads * (static_cast<double>(n) * (n + 1) / 2);
    std::printf("%7d %10.3f %10.1f\n", n, t, flops / (t * 1e-3) / 1e12);
    CUDA_CHECK(cudaEventDestroy(a));
    CUDA_CHECK(cudaEventDestroy(b));
    CUDA_CHECK(cudaFree(q));
    CUDA_CHECK(cudaFree(out));
    CUDA_CHECK(cudaFree(k));
    CUDA_CHECK(cudaFree(v));
  }
}

}  // namespace servedeck::bench
