// Routed experts for one decoded token. The expert's weights are read through a device-side
// pointer table: a hot expert's pointer is VRAM (hot-expert cache), a cold one's is a UVA
// pointer into pinned host memory, so a miss streams exactly that expert over PCIe and the
// selection needs no device→host sync (the step stays capturable in a CUDA graph).
#include "worker/cuda/kernels.cuh"
#include "worker/cuda/launch_check.cuh"

namespace servedeck::worker::cuda {

namespace {

constexpr int k_warps = 8;

__device__ __forceinline__ float dot8(uint4 w, float4 a, float4 b) {
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&w);
  float2 f0 = __bfloat1622float2(h[0]), f1 = __bfloat1622float2(h[1]);
  float2 f2 = __bfloat1622float2(h[2]), f3 = __bfloat1622float2(h[3]);
  return f0.x * a.x + f0.y * a.y + f1.x * a.z + f1.y * a.w + f2.x * b.x + f2.y * b.y + f3.x * b.z + f3.y * b.w;
}

__device__ __forceinline__ float row_dot(const __nv_bfloat16* row, const float* x, int n, int lane) {
  const uint4* w = reinterpret_cast<const uint4*>(row);
  const float4* x4 = reinterpret_cast<const float4*>(x);
  const int n8 = n / 8;
  float acc = 0.f;
  int i = lane;
  for (; i + 96 < n8; i += 128) {
    uint4 w0 = w[i], w1 = w[i + 32], w2 = w[i + 64], w3 = w[i + 96];
    acc += dot8(w0, x4[2 * i], x4[2 * i + 1]) + dot8(w1, x4[2 * (i + 32)], x4[2 * (i + 32) + 1]) +
           dot8(w2, x4[2 * (i + 64)], x4[2 * (i + 64) + 1]) + dot8(w3, x4[2 * (i + 96)], x4[2 * (i + 96) + 1]);
  }
  for (; i < n8; i += 32) acc += dot8(w[i], x4[2 * i], x4[2 * i + 1]);
  for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  return acc;
}

// gate|up rows of the k routed experts: scratch[j, r] = W_j[r, :] · x, r in [0, 2*inter).
__global__ void moe_gate_up_kernel(ExpertTable t, const float* __restrict__ x, const int32_t* __restrict__ ids, int k,
                                   float* __restrict__ scratch) {
  const int global_warp = blockIdx.x * k_warps + threadIdx.x / 32;
  const int rows = 2 * t.inter;
  if (global_warp >= k * rows) return;
  const int j = global_warp / rows, r = global_warp % rows;
  const __nv_bfloat16* block = t.experts[ids[j]];
  const float v = row_dot(block + static_cast<size_t>(r) * t.hidden, x, t.hidden, threadIdx.x % 32);
  if (threadIdx.x % 32 == 0) scratch[static_cast<size_t>(j) * rows + r] = v;
}

// In place: scratch[j, i] = silu(gate) * up for i < inter.
__global__ void moe_act_kernel(float* scratch, int k, int inter) {
  const int n = k * inter;
  for (int idx = blockIdx.x * blockDim.x + threadIdx.x; idx < n; idx += gridDim.x * blockDim.x) {
    const int j = idx / inter, i = idx % inter;
    float* row = scratch + static_cast<size_t>(j) * 2 * inter;
    const float g = row[i];
    row[i] = g / (1.f + expf(-g)) * row[inter + i];
  }
}

// down rows: partial[j, h] = D_j[h, :] · act_j.
__global__ void moe_down_kernel(ExpertTable t, const float* __restrict__ scratch, const int32_t* __restrict__ ids, int k,
                                float* __restrict__ partial) {
  const int global_warp = blockIdx.x * k_warps + threadIdx.x / 32;
  if (global_warp >= k * t.hidden) return;
  const int j = global_warp / t.hidden, h = global_warp % t.hidden;
  const __nv_bfloat16* down = t.experts[ids[j]] + static_cast<size_t>(2) * t.inter * t.hidden;
  const float v = row_dot(down + static_cast<size_t>(h) * t.inter, scratch + static_cast<size_t>(j) * 2 * t.inter,
                          t.inter, threadIdx.x % 32);
  if (threadIdx.x % 32 == 0) partial[static_cast<size_t>(j) * t.hidden + h] = v;
}

// out[h] += sum_j w_j partial[j, h], j in order: one reduction, fixed order.
__global__ void moe_reduce_kernel(const float* __restrict__ partial, const float* __restrict__ weights, int k,
                                  int hidden, float* __restrict__ out) {
  for (int h = blockIdx.x * blockDim.x + threadIdx.x; h < hidden; h += gridDim.x * blockDim.x) {
    float acc = 0.f;
    for (int j = 0; j < k; ++j) acc += weights[j] * partial[static_cast<size_t>(j) * hidden + h];
    out[h] += acc;
  }
}

}  // namespace

void launch_moe_decode(const ExpertTable& table, const float* x, const int32_t* ids, const float* weights, int k,
                       float* scratch, float* partial, float* out, cudaStream_t stream) {
  using detail::require;
  require(table.hidden % 8 == 0 && table.inter % 8 == 0, "launch_moe_decode",
          "hidden and inter must be multiples of 8, got " + std::to_string(table.hidden) + ", " + std::to_string(table.inter));
  require(k > 0, "launch_moe_decode", "k must be positive");
  const int gu_warps = k * 2 * table.inter;
  moe_gate_up_kernel<<<(gu_warps + k_warps - 1) / k_warps, 32 * k_warps, 0, stream>>>(table, x, ids, k, scratch);
  detail::check_launch();
  const int act = k * table.inter;
  moe_act_kernel<<<(act + 255) / 256, 256, 0, stream>>>(scratch, k, table.inter);
  detail::check_launch();
  const int down_warps = k * table.hidden;
  moe_down_kernel<<<(down_warps + k_warps - 1) / k_warps, 32 * k_warps, 0, stream>>>(table, scratch, ids, k, partial);
  detail::check_launch();
  moe_reduce_kernel<<<(table.hidden + 255) / 256, 256, 0, stream>>>(partial, weights, k, table.hidden, out);
  detail::check_launch();
}

}  // namespace servedeck::worker::cuda
