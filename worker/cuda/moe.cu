// Routed experts for one decoded token. The expert's weights are read through a device-side
// pointer table: a hot expert's pointer is VRAM (hot-expert cache), a cold one's is a UVA
// pointer into pinned host memory, so a miss streams exactly that expert over PCIe and the
// selection needs no device→host sync (the step stays capturable in a CUDA graph).
#include "worker/cuda/dot.cuh"
#include "worker/cuda/kernels.cuh"
#include "worker/cuda/launch_check.cuh"

namespace servedeck::worker::cuda {

namespace {

constexpr int k_warps = 8;

/// row·x reduced over the warp (every lane gets it): dot.cuh's lane_dot and warp_sum.
__device__ __forceinline__ float row_dot(const __nv_bfloat16* row, const float* x, int n, int lane) {
  return detail::warp_sum(detail::lane_dot(row, x, n, lane));
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
