// Launch helpers shared by the fused decode kernels (internal to worker/cuda): the PDL wait,
// the launch with the programmatic-serialization attribute, grid sizing.
#pragma once

#include <cstddef>

#include <cuda_runtime.h>

#include "worker/cuda/cuda_check.hpp"

namespace servedeck::worker::cuda::detail {

/// Multiprocessors of the current device (read once).
inline int sm_count() {
  static const int n = [] {
    int dev = 0, v = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev));
    return v;
  }();
  return n;
}

// Programmatic dependent launch: a kernel launched with `pdl` may be scheduled while its
// predecessor in the stream finishes; it waits here, before touching any memory, until the
// predecessor has completed and its writes are visible. Then it lets its own dependent be
// scheduled early (that one waits in turn for this grid's completion before reading anything).
// Without PDL both instructions do nothing.
__device__ __forceinline__ void wait_for_predecessor() {
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" :::);
}

// Kernels whose dynamic shared memory may exceed the default 48 KB opt in once per size.
template <class Kernel>
inline void allow_dynamic_smem(Kernel kernel, std::size_t bytes) {
  if (bytes > 48 * 1024)
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
}

template <class... KArgs, class... Args>
inline void launch(void (*kernel)(KArgs...), int grid, int block, std::size_t smem, cudaStream_t stream, bool pdl, Args... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(static_cast<unsigned>(grid));
  cfg.blockDim = dim3(static_cast<unsigned>(block));
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl ? 1 : 0;
  CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, static_cast<KArgs>(args)...));
}

/// Blocks for `rows` rows at `warps` warps per block and one row per warp, capped at what the
/// device holds at full occupancy (the kernels loop over rows beyond it).
inline int grid_for(int rows, int warps) {
  const int want = (rows + warps - 1) / warps;
  const int cap = sm_count() * (2048 / (warps * 32));
  return want < cap ? want : cap;
}


}  // namespace servedeck::worker::cuda::detail
