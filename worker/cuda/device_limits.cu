// The current device's shared-memory limit per block, with the diagnostic override
// (fused_launch.cuh, smem_per_block).
#include <cerrno>
#include <cstdlib>

#include "worker/cuda/fused_launch.cuh"

namespace servedeck::worker::cuda::detail {

std::size_t smem_per_block() {
  static const std::size_t limit = [] {
    int dev = 0, optin = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    std::size_t bytes = static_cast<std::size_t>(optin);
    // The diagnostic override: a positive decimal byte count below the device's limit; anything
    // else (unset, empty, not a whole number, larger) leaves the device's.
    if (const char* v = std::getenv("SERVEDECK_CUDA_SMEM_PER_BLOCK"); v != nullptr && *v != '\0') {
      char* end = nullptr;
      errno = 0;
      const unsigned long long n = std::strtoull(v, &end, 10);
      if (errno == 0 && *end == '\0' && n > 0 && n < bytes) bytes = static_cast<std::size_t>(n);
    }
    return bytes;
  }();
  return limit;
}

}  // namespace servedeck::worker::cuda::detail
