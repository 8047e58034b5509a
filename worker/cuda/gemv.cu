// bf16 weight × fp32 vector: the decode path's dense projections and expert GEMVs.
#include "worker/cuda/kernels.cuh"
#include "worker/cuda/launch_check.cuh"

namespace servedeck::worker::cuda {

namespace {

constexpr int k_warps_per_block = 8;

__device__ __forceinline__ float dot8(uint4 w, float4 a, float4 b) {
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&w);
  float2 f0 = __bfloat1622float2(h[0]);
  float2 f1 = __bfloat1622float2(h[1]);
  float2 f2 = __bfloat1622float2(h[2]);
  float2 f3 = __bfloat1622float2(h[3]);
  return f0.x * a.x + f0.y * a.y + f1.x * a.z + f1.y * a.w + f2.x * b.x + f2.y * b.y + f3.x * b.z + f3.y * b.w;
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// One warp per output row; each lane reads 16 bytes (8 bf16) per step. Four independent loads
// in flight per lane keep enough bytes outstanding for PCIe (UVA) as well as HBM.
__global__ void gemv_bf16_kernel(const __nv_bfloat16* __restrict__ W, const float* __restrict__ x,
                                 float* __restrict__ y, int out, int in, int accumulate) {
  const int row = blockIdx.x * k_warps_per_block + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= out) return;
  const uint4* w = reinterpret_cast<const uint4*>(W + static_cast<size_t>(row) * in);
  const float4* x4 = reinterpret_cast<const float4*>(x);
  const int n8 = in / 8;
  float acc = 0.f;
  int i = lane;
  for (; i + 96 < n8; i += 128) {
    uint4 w0 = w[i], w1 = w[i + 32], w2 = w[i + 64], w3 = w[i + 96];
    acc += dot8(w0, x4[2 * i], x4[2 * i + 1]);
    acc += dot8(w1, x4[2 * (i + 32)], x4[2 * (i + 32) + 1]);
    acc += dot8(w2, x4[2 * (i + 64)], x4[2 * (i + 64) + 1]);
    acc += dot8(w3, x4[2 * (i + 96)], x4[2 * (i + 96) + 1]);
  }
  for (; i < n8; i += 32) acc += dot8(w[i], x4[2 * i], x4[2 * i + 1]);
  acc = warp_sum(acc);
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
