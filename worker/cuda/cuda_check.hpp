// CUDA_CHECK: every CUDA runtime call goes through it. On failure it throws CudaError naming
// the statement, the function, file:line, the current device and the error's name and text.
#pragma once

#include <stdexcept>
#include <string>

#include <cuda_runtime.h>

namespace servedeck::worker::cuda {

struct CudaError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

[[noreturn]] void throw_cuda_error(cudaError_t err, const char* stmt, const char* func, const char* file, int line);

}  // namespace servedeck::worker::cuda

#define CUDA_CHECK(stmt)                                                                        \
  do {                                                                                          \
    cudaError_t servedeck_cuda_err_ = (stmt);                                                   \
    if (servedeck_cuda_err_ != cudaSuccess)                                                     \
      ::servedeck::worker::cuda::throw_cuda_error(servedeck_cuda_err_, #stmt, __func__, __FILE__, __LINE__); \
  } while (0)
