// RMSNorm, rotary embedding, embedding lookup and element-wise ops of the decode path.
#include <cmath>

#include "worker/cuda/kernels.cuh"
#include "worker/cuda/launch_check.cuh"

namespace servedeck::worker::cuda {

namespace {

__global__ void rmsnorm_kernel(const float* __restrict__ x, const __nv_bfloat16* __restrict__ w, float* y, int dim,
                               float eps) {
  const float* xr = x + static_cast<size_t>(blockIdx.x) * dim;
  float* yr = y + static_cast<size_t>(blockIdx.x) * dim;
  __shared__ float partial[32];
  float ss = 0.f;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) ss += xr[i] * xr[i];
  for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = ss;
  __syncthreads();
  if (threadIdx.x < 32) {
    float v = threadIdx.x < blockDim.x / 32 ? partial[threadIdx.x] : 0.f;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (threadIdx.x == 0) partial[0] = v;
  }
  __syncthreads();
  const float inv = rsqrtf(partial[0] / dim + eps);
  for (int i = threadIdx.x; i < dim; i += blockDim.x) yr[i] = xr[i] * inv * __bfloat162float(w[i]);
}

__global__ void rope_kernel(float* q, float* k, int n_heads, int n_kv_heads, int head_dim, int rotary_dim,
                            const int32_t* pos, float theta) {
  const int head = blockIdx.x;  // [0, n_heads + n_kv_heads)
  float* v = head < n_heads ? q + static_cast<size_t>(head) * head_dim
                            : k + static_cast<size_t>(head - n_heads) * head_dim;
  const int half = rotary_dim / 2;
  const float p = static_cast<float>(*pos);
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    // As transformers and the CPU reference: inv_freq = 1 / theta^(fp32(2i / rotary_dim)).
    const float expo = static_cast<float>(2 * i) / static_cast<float>(rotary_dim);
    const float inv_freq = 1.0f / static_cast<float>(pow(static_cast<double>(theta), static_cast<double>(expo)));
    const float angle = p * inv_freq;
    float s, c;
    sincosf(angle, &s, &c);
    const float x1 = v[i], x2 = v[i + half];
    v[i] = x1 * c - x2 * s;
    v[i + half] = x2 * c + x1 * s;
  }
}

__global__ void embed_kernel(const __nv_bfloat16* table, const int32_t* token, float* x, int hidden) {
  const __nv_bfloat16* row = table + static_cast<size_t>(*token) * hidden;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < hidden; i += gridDim.x * blockDim.x) x[i] = __bfloat162float(row[i]);
}

__global__ void add_kernel(float* x, const float* y, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) x[i] += y[i];
}

__global__ void swiglu_kernel(const float* g, const float* u, float* h, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    const float a = g[i];
    h[i] = a / (1.f + expf(-a)) * u[i];
  }
}

__global__ void kv_append_kernel(const float* k, const float* v, float* kc, float* vc, const int32_t* pos, int kv_dim) {
  const size_t base = static_cast<size_t>(*pos) * kv_dim;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < kv_dim; i += gridDim.x * blockDim.x) {
    kc[base + i] = k[i];
    vc[base + i] = v[i];
  }
}

int blocks_for(int n) { return (n + 255) / 256 < 1024 ? (n + 255) / 256 : 1024; }

}  // namespace

void launch_rmsnorm(const float* x, const __nv_bfloat16* w, float* y, int rows, int dim, float eps, cudaStream_t stream) {
  detail::require(rows > 0 && dim > 0, "launch_rmsnorm", "rows and dim must be positive");
  const int threads = dim >= 1024 ? 1024 : ((dim + 31) / 32) * 32;
  rmsnorm_kernel<<<rows, threads, 0, stream>>>(x, w, y, dim, eps);
  detail::check_launch();
}

void launch_rope(float* q, float* k, int n_heads, int n_kv_heads, int head_dim, int rotary_dim, const int32_t* pos,
                 float theta, cudaStream_t stream) {
  detail::require(rotary_dim > 0 && rotary_dim <= head_dim && rotary_dim % 2 == 0, "launch_rope",
                  "rotary_dim must be even and in (0, head_dim=" + std::to_string(head_dim) + "], got " + std::to_string(rotary_dim));
  rope_kernel<<<n_heads + n_kv_heads, 64, 0, stream>>>(q, k, n_heads, n_kv_heads, head_dim, rotary_dim, pos, theta);
  detail::check_launch();
}

void launch_embed(const __nv_bfloat16* table, const int32_t* token, float* x, int hidden, cudaStream_t stream) {
  embed_kernel<<<blocks_for(hidden), 256, 0, stream>>>(table, token, x, hidden);
  detail::check_launch();
}

void launch_add(float* x, const float* y, int n, cudaStream_t stream) {
  add_kernel<<<blocks_for(n), 256, 0, stream>>>(x, y, n);
  detail::check_launch();
}

void launch_swiglu(const float* g, const float* u, float* h, int n, cudaStream_t stream) {
  swiglu_kernel<<<blocks_for(n), 256, 0, stream>>>(g, u, h, n);
  detail::check_launch();
}

void launch_kv_append(const float* k, const float* v, float* k_cache, float* v_cache, const int32_t* pos, int kv_dim,
                      cudaStream_t stream) {
  kv_append_kernel<<<blocks_for(kv_dim), 256, 0, stream>>>(k, v, k_cache, v_cache, pos, kv_dim);
  detail::check_launch();
}

}  // namespace servedeck::worker::cuda
