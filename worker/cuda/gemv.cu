// bf16 weight × fp32 vector: the decode path's dense projections and expert GEMVs.
#include "worker/cuda/dot.cuh"
#include "worker/cuda/kernels.cuh"
#include "worker/cuda/launch_check.cuh"

namespace servedeck::worker::cuda {

namespace {

constexpr int k_warps_per_block = 8;

// One warp per output row; each lane reads 16 bytes (8 bf16) per step. Four independent loads
// in flight per lane keep enough bytes outstanding for PCIe (UVA) as well as HBM.
__global__ void gemv_bf16_kernel(const __nv_bfloat16* __restrict__ W, const float* __restrict__ x,
                                 float* __restrict__ y, int out, int in, int accumulate) {
  const int row = blockIdx.x * k_warps_per_block + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= out) return;
  const float acc = detail::warp_sum(detail::lane_dot(W + static_cast<size_t>(row) * in, x, in, lane));
  if (lane == 0) y[row] = accumulate ? y[row] + acc : acc;
}

}  // namespace

void launch_gemv_bf16(const __nv_bfloat16* W, const float* x, float* y, int out, int in, bool accumulate,
                      cudaStream_t stream) {
  using detail::require;
  require(out > 0 && in > 0, "launch_gemv_bf16", "out and in must be positive, got " + std::to_string(out) + ", " + std::to_string(in));
  require(in % 8 == 0, "launch_gemv_bf16", "in must be a multiple of 8 (16-byte rows), got " + std::to_string(in));
  require(detail::aligned16(W) && detail::aligned16(x), "launch_gemv_bf16", "W and x must be 16-byte aligned");
  const int blocks = (out + k_warps_per_block - 1) / k_warps_per_block;
  gemv_bf16_kernel<<<blocks, 32 * k_warps_per_block, 0, stream>>>(W, x, y, out, in, accumulate ? 1 : 0);
  detail::check_launch();
}

}  // namespace servedeck::worker::cuda
