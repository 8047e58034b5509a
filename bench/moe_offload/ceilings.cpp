#include "bench/moe_offload/ceilings.hpp"

#include <algorithm>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "worker/cuda/cuda_check.hpp"
#include "worker/cuda/kernels.cuh"

namespace servedeck::bench {

namespace cuda = worker::cuda;

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

/// Times `fn` with CUDA events, median of `reps` after one warm-up. Returns seconds.
template <class F>
double time_events(F fn, int reps) {
  cudaEvent_t a, b;
  CUDA_CHECK(cudaEventCreate(&a));
  CUDA_CHECK(cudaEventCreate(&b));
  fn();
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    CUDA_CHECK(cudaEventRecord(a));
    fn();
    CUDA_CHECK(cudaEventRecord(b));
    CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms / 1000.0);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return median(t);
}

}  // namespace

Ceilings measure_ceilings() {
  const std::size_t bytes = 2ull << 30;  // 2 GiB
  const int in = 2048, out = static_cast<int>(bytes / (in * 2));
  void* host = nullptr;
  CUDA_CHECK(cudaHostAlloc(&host, bytes, cudaHostAllocMapped));
  std::fill_n(static_cast<unsigned char*>(host), bytes, 0x3c);  // bf16 ≈ 0.0115: finite, nonzero
  void* dev = nullptr;
  CUDA_CHECK(cudaMalloc(&dev, bytes));
  float *x, *y;
  CUDA_CHECK(cudaMalloc(&x, in * sizeof(float)));
  CUDA_CHECK(cudaMalloc(&y, static_cast<std::size_t>(out) * sizeof(float)));
  CUDA_CHECK(cudaMemset(x, 0, in * sizeof(float)));
  Ceilings c{};
  c.h2d_gbs = bytes / time_events([&] { CUDA_CHECK(cudaMemcpy(dev, host, bytes, cudaMemcpyHostToDevice)); }, 5) / 1e9;
  void* uva = nullptr;
  CUDA_CHECK(cudaHostGetDevicePointer(&uva, host, 0));
  c.uva_gbs = bytes / time_events([&] {
    cuda::launch_gemv_bf16(static_cast<const __nv_bfloat16*>(uva), x, y, out, in, false, nullptr);
  }, 5) / 1e9;
  c.hbm_gbs = bytes / time_events([&] {
    cuda::launch_gemv_bf16(static_cast<const __nv_bfloat16*>(dev), x, y, out, in, false, nullptr);
  }, 20) / 1e9;
  cudaFree(x);
  cudaFree(y);
  cudaFree(dev);
  cudaFreeHost(host);
  return c;
}


}  // namespace servedeck::bench
