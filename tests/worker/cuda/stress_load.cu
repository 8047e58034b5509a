#include "tests/worker/cuda/stress_load.hpp"

#include "worker/cuda/cuda_check.hpp"

namespace gpu_test {

namespace {

__device__ unsigned long long now_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Every block stays until hold_ns have passed since it started (a sleeping wait: it holds its
// SM's resources without competing for issue slots); its dynamic shared memory (smem bytes, none
// for the delay block) is touched so it is used.
__global__ void hold_kernel(unsigned hold_ns, unsigned smem_bytes) {
  extern __shared__ unsigned char smem[];
  const unsigned long long t0 = now_ns();
  if (threadIdx.x == 0 && smem_bytes > 0) smem[smem_bytes - 1] = 1;
  while (now_ns() - t0 < hold_ns) __nanosleep(500);
}

}  // namespace

void launch_sm_load(cudaStream_t stream, unsigned delay_ns, int blocks, int threads, std::size_t smem, unsigned hold_ns) {
  CUDA_CHECK(cudaFuncSetAttribute(hold_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 96 * 1024));
  if (delay_ns > 0) hold_kernel<<<1, 32, 0, stream>>>(delay_ns, 0u);
  hold_kernel<<<blocks, threads, smem, stream>>>(hold_ns, static_cast<unsigned>(smem));
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace gpu_test
