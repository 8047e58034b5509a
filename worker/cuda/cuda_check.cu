#include "worker/cuda/cuda_check.hpp"

namespace servedeck::worker::cuda {

void throw_cuda_error(cudaError_t err, const char* stmt, const char* func, const char* file, int line) {
  int device = -1;
  cudaGetDevice(&device);
  throw CudaError(std::string("CUDA error ") + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ") in `" +
                  stmt + "` at " + func + " " + file + ":" + std::to_string(line) + ", device " + std::to_string(device));
}

}  // namespace servedeck::worker::cuda
