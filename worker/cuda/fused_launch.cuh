// Launch helpers shared by the fused decode kernels (internal to worker/cuda): the device's limits
// (multiprocessors, shared memory per block, PDL), the PDL wait and trigger, the launch with the
// programmatic-serialization attribute, grid sizing. The kernel-to-kernel handshakes that run
// ahead of the PDL order are in handshakes.cuh.
#pragma once

#include <cstddef>

#include <cuda_runtime.h>

#include "worker/cuda/cuda_check.hpp"
#include "worker/cuda/decode_trace.cuh"

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

/// True when the current device runs programmatic dependent launch (compute capability 9.0 and
/// later; read once). Elsewhere launch() drops the attribute and the kernels' griddepcontrol
/// instructions are compiled out (wait_for_predecessor), so the step runs in plain stream order.
inline bool device_has_pdl() {
  static const bool v = [] {
    int dev = 0, major = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    return major >= 9;
  }();
  return v;
}

/// Bytes of shared memory (static + dynamic) one block may use on the current device: the
/// device's opt-in limit (cudaDevAttrMaxSharedMemoryPerBlockOptin: 227 KB on H100/H200, 99 KB on
/// SM89 and on SM120 workstation and consumer cards), or less when the environment variable
/// SERVEDECK_CUDA_SMEM_PER_BLOCK holds a smaller positive byte count: a diagnostic that makes an
/// H200 take the paths a card with less shared memory takes (the GPU tests run under
/// SERVEDECK_CUDA_SMEM_PER_BLOCK=101376, docs/cuda-backend.md). Read once per process.
std::size_t smem_per_block();

/// Shared memory of `kernel`'s static __shared__ variables (cudaFuncGetAttributes).
template <class Kernel>
inline std::size_t static_smem(Kernel kernel) {
  cudaFuncAttributes a{};
  CUDA_CHECK(cudaFuncGetAttributes(&a, reinterpret_cast<const void*>(kernel)));
  return a.sharedSizeBytes;
}

/// True when a block of `kernel` with `dynamic_bytes` of dynamic shared memory fits
/// smem_per_block() beside the kernel's static shared memory.
template <class Kernel>
inline bool fits_smem(Kernel kernel, std::size_t dynamic_bytes) {
  return dynamic_bytes + static_smem(kernel) <= smem_per_block();
}

/// Lets `kernel` launch with up to `max_bytes` of dynamic shared memory on the current device
/// (the default limit is 48 KB including static shared memory), capped at what the device allows
/// beside its static shared memory. Call with the kernel's fixed maximum, never a per-launch size:
/// the attribute belongs to the function, so a smaller later value would lower the limit for
/// every launch.
template <class Kernel>
inline void allow_dynamic_smem(Kernel kernel, std::size_t max_bytes) {
  const std::size_t cap = smem_per_block() - static_smem(kernel);
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  static_cast<int>(max_bytes < cap ? max_bytes : cap)));
}

/// Asks for the largest shared-memory carveout while `kernel` runs, so that a block of the next
/// kernel with a large shared-memory stage (launched early by PDL) fits on the same SM: the SM's
/// L1/shared split is set when a kernel's blocks are placed and cannot grow under running blocks.
template <class Kernel>
inline void prefer_max_shared(Kernel kernel) {
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared));
}

// Programmatic dependent launch (PDL, sm_90 and later): a kernel launched with `pdl` may be
// scheduled while its predecessor in the stream finishes; it waits in wait_for_predecessor,
// before reading anything the predecessor (or an earlier kernel of the step) wrote, until the
// predecessor has completed and its writes are visible, and only then lets its own dependent be
// scheduled. The decode step relies on that order: kernel N+1 cannot start before kernel N-1
// has finished, and a kernel's completion implies its predecessor's. handshakes.cuh lists the
// kernels that trigger their dependent earlier (trigger_dependents at their start) and what
// their dependents may read before their own wait. Weights, never written during a step, may be
// read before the wait by any kernel.
// Built for a target without PDL (sm_89) both instructions are compiled out: launch() never sets
// the attribute on such a device, so each kernel starts after its predecessor completed.
__device__ __forceinline__ void trigger_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}

__device__ __forceinline__ void wait_for_predecessor() {
#ifdef SERVEDECK_DECODE_TRACE
  const unsigned long long t_wait = trace_now();
#endif
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
  trigger_dependents();
#ifdef SERVEDECK_DECODE_TRACE
  if (DecodeTraceRecord* r = trace_slot()) {
    r->t_wait = t_wait;
    r->t_waited = trace_now();
  }
#endif
}

/// Waits for the predecessor without triggering the dependent (a kernel that triggered at its
/// start: the folded router's block 0, handshakes.cuh).
__device__ __forceinline__ void wait_only() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

/// Launches `kernel`, with the programmatic-serialization attribute when `pdl` and the device
/// runs PDL (device_has_pdl).
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
  cfg.numAttrs = pdl && device_has_pdl() ? 1 : 0;
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
