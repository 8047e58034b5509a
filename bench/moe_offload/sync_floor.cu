// bench_sync_floor: what one dependent step costs on this GPU, two ways, in one run:
//   1. a kernel boundary: a CUDA graph of N back-to-back PDL launches of a kernel whose every
//      block reads the value the previous launch wrote and writes the next (as the decode step's
//      six launches per layer do);
//   2. a grid barrier inside one persistent kernel (an atomic arrival counter and a generation
//      word, as a persistent decode kernel would use): the same chain across N barriers.
// Result on the H200 (docs/performance.md, 2026-11-29 "sync floor"): PDL boundary 0.96 µs, plain graph 1.22 µs, grid barrier 2.15 µs — a persistent per-layer kernel
// would pay more per phase than the six PDL launches do, so the decode step stays six launches.
// Prints µs per step for each, at the decode kernels' grid (2 blocks of 256 threads per SM).
// Usage: bench_sync_floor [steps]   (GPU machine only; exit 77 without a device)
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include <cuda_runtime.h>

#include "worker/cuda/cuda_check.hpp"
#include "worker/cuda/fused_launch.cuh"

namespace {

/// Sense-free generation barrier over `blocks` co-resident blocks. `count` and `generation` are
/// two device words, zeroed once; the barrier leaves `count` at zero after each use, so one pair
/// serves any number of launches in sequence (never two kernels using it at the same time).
/// Memory: writes of every block before sync() are visible to every block after it when read
/// with L1-bypassing loads (__ldcg / ld.acquire); plain cached loads may see stale L1 lines.
/// The caller guarantees co-residency (grid <= blocks per SM x SMs at the kernel's occupancy),
/// otherwise sync() never returns.
struct GridBarrier {
  unsigned int* count;
  unsigned int* generation;
  unsigned int blocks;

  __device__ __forceinline__ void sync() const {
    __syncthreads();
    if (threadIdx.x == 0) {
      unsigned int gen;
      asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(gen) : "l"(generation) : "memory");
      __threadfence();  // this block's writes before the arrival
      if (atomicAdd(count, 1u) == blocks - 1) {
        *count = 0u;
        __threadfence();
        atomicAdd(generation, 1u);
      } else {
        unsigned int now;
        do {
          asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(now) : "l"(generation) : "memory");
        } while (now == gen);
      }
      __threadfence();
    }
    __syncthreads();
  }
};


__global__ void chain_step(float* buf, int i) {
  servedeck::worker::cuda::detail::wait_for_predecessor();
  __shared__ float v;
  if (threadIdx.x == 0) v = __ldcg(buf + (i - 1) * gridDim.x + blockIdx.x) + 1.f;
  __syncthreads();
  if (threadIdx.x == 0) buf[i * gridDim.x + (blockIdx.x + 1) % gridDim.x] = v;
}

__global__ void barrier_chain(float* buf, int steps, GridBarrier bar) {
  __shared__ float v;
  for (int i = 1; i <= steps; ++i) {
    if (threadIdx.x == 0) v = __ldcg(buf + (i - 1) * gridDim.x + blockIdx.x) + 1.f;
    __syncthreads();
    if (threadIdx.x == 0) buf[i * gridDim.x + (blockIdx.x + 1) % gridDim.x] = v;
    bar.sync();
  }
}

float time_graph(cudaStream_t st, const std::vector<cudaGraphExec_t>& ge) {
  cudaEvent_t a, b;
  CUDA_CHECK(cudaEventCreate(&a));
  CUDA_CHECK(cudaEventCreate(&b));
  std::vector<float> ts;
  for (int r = 0; r < 7; ++r) {
    CUDA_CHECK(cudaEventRecord(a, st));
    for (auto g : ge) CUDA_CHECK(cudaGraphLaunch(g, st));
    CUDA_CHECK(cudaEventRecord(b, st));
    CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    if (r > 0) ts.push_back(ms);
  }
  std::sort(ts.begin(), ts.end());
  return ts[ts.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const int steps = argc > 1 ? std::atoi(argv[1]) : 64;
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    std::printf("no CUDA device: this benchmark runs on the GPU machine only\n");
    return 77;
  }
  int sms = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const int grid = 2 * sms;
  float* buf = nullptr;
  CUDA_CHECK(cudaMalloc(&buf, sizeof(float) * grid * (steps + 1)));
  CUDA_CHECK(cudaMemset(buf, 0, sizeof(float) * grid * (steps + 1)));
  unsigned int* state = nullptr;
  CUDA_CHECK(cudaMalloc(&state, 2 * sizeof(unsigned int)));
  CUDA_CHECK(cudaMemset(state, 0, 2 * sizeof(unsigned int)));
  cudaStream_t st;
  CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));

  auto capture = [&](auto body) {
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CUDA_CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    body();
    CUDA_CHECK(cudaStreamEndCapture(st, &g));
    CUDA_CHECK(cudaGraphInstantiate(&ge, g, 0));
    return ge;
  };
  auto launch_step = [&](int i, bool pdl) {
    servedeck::worker::cuda::detail::launch(chain_step, grid, 256, 0, st, pdl, buf, i);
  };
  const auto pdl_graph = capture([&] { for (int i = 1; i <= steps; ++i) launch_step(i, true); });
  const auto plain_graph = capture([&] { for (int i = 1; i <= steps; ++i) launch_step(i, false); });
  const GridBarrier bar{state, state + 1, static_cast<unsigned int>(grid)};
  const auto barrier_graph = capture([&] { barrier_chain<<<grid, 256, 0, st>>>(buf, steps, bar); });
  const auto one_barrier = capture([&] { barrier_chain<<<grid, 256, 0, st>>>(buf, 1, bar); });

  const float t_pdl = time_graph(st, {pdl_graph});
  const float t_plain = time_graph(st, {plain_graph});
  const float t_bar = time_graph(st, {barrier_graph});
  const float t_one = time_graph(st, {one_barrier});
  std::printf("dependent step cost, grid %d x 256 threads (%d SMs), %d steps:\n", grid, sms, steps);
  std::printf("  kernel boundary, PDL graph:    %7.2f us/step\n", 1000.f * t_pdl / steps);
  std::printf("  kernel boundary, plain graph:  %7.2f us/step\n", 1000.f * t_plain / steps);
  std::printf("  grid barrier, one kernel:      %7.2f us/step (launch of 1 step %.2f us subtracted)\n",
              1000.f * (t_bar - t_one) / (steps - 1), 1000.f * t_one);
  // The chain must have run: every slot of the last step holds `steps`.
  std::vector<float> last(static_cast<std::size_t>(grid));
  CUDA_CHECK(cudaMemcpy(last.data(), buf + static_cast<std::size_t>(steps) * grid, grid * sizeof(float), cudaMemcpyDeviceToHost));
  for (float v : last)
    if (v < 1.f) {
      std::printf("chain did not run (last step holds %g)\n", v);
      return 1;
    }
  std::printf("chain check: last step values >= 1 in all %d slots\n", grid);
  return 0;
}
