// Single-query attention for decode (batch 1) over the fp32 KV cache.
#include <cmath>

#include "worker/cuda/kernels.cuh"
#include "worker/cuda/launch_check.cuh"

namespace servedeck::worker::cuda {

namespace {

constexpr int k_threads = 256;

__device__ float block_reduce(float v, float* shared, bool is_max) {
  for (int o = 16; o > 0; o >>= 1) {
    float other = __shfl_xor_sync(0xffffffffu, v, o);
    v = is_max ? fmaxf(v, other) : v + other;
  }
  if (threadIdx.x % 32 == 0) shared[threadIdx.x / 32] = v;
  __syncthreads();
  if (threadIdx.x < 32) {
    float w = threadIdx.x < blockDim.x / 32 ? shared[threadIdx.x] : (is_max ? -INFINITY : 0.f);
    for (int o = 16; o > 0; o >>= 1) {
      float other = __shfl_xor_sync(0xffffffffu, w, o);
      w = is_max ? fmaxf(w, other) : w + other;
    }
    if (threadIdx.x == 0) shared[0] = w;
  }
  __syncthreads();
  float r = shared[0];
  __syncthreads();
  return r;
}

// One block per query head. Pass 1: scores into global scratch; softmax statistics by block
// reduction; pass 2: each thread owns output dimensions and sums p_t * v_t over positions.
__global__ void attention_decode_kernel(const float* __restrict__ q, const float* __restrict__ kc,
                                        const float* __restrict__ vc, float* __restrict__ scores,
                                        float* __restrict__ out, int n_heads, int n_kv_heads, int head_dim,
                                        const int32_t* pos, int max_len) {
  __shared__ float qs[256];
  __shared__ float red[32];
  const int h = blockIdx.x;
  const int kvh = h / (n_heads / n_kv_heads);
  const int kv_dim = n_kv_heads * head_dim;
  const int len = *pos + 1;
  const float scale = rsqrtf(static_cast<float>(head_dim));
  for (int d = threadIdx.x; d < head_dim; d += blockDim.x) qs[d] = q[h * head_dim + d];
  __syncthreads();
  float* s = scores + static_cast<size_t>(h) * max_len;
  float m = -INFINITY;
  for (int t = threadIdx.x; t < len; t += blockDim.x) {
    const float* kt = kc + static_cast<size_t>(t) * kv_dim + kvh * head_dim;
    float acc = 0.f;
    for (int d = 0; d < head_dim; ++d) acc += qs[d] * kt[d];
    acc *= scale;
    s[t] = acc;
    m = fmaxf(m, acc);
  }
  m = block_reduce(m, red, true);
  float sum = 0.f;
  for (int t = threadIdx.x; t < len; t += blockDim.x) {
    float e = expf(s[t] - m);
    s[t] = e;
    sum += e;
  }
  sum = block_reduce(sum, red, false);
  __syncthreads();  // every s[t] written before pass 2 reads all of them
  const float inv = 1.f / sum;
  for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
    float acc = 0.f;
    for (int t = 0; t < len; ++t) acc += s[t] * vc[static_cast<size_t>(t) * kv_dim + kvh * head_dim + d];
    out[h * head_dim + d] = acc * inv;
  }
}

}  // namespace

void launch_attention_decode(const float* q, const float* k_cache, const float* v_cache, float* scores, float* out,
                             int n_heads, int n_kv_heads, int head_dim, const int32_t* pos, int max_len,
                             cudaStream_t stream) {
  using detail::require;
  require(head_dim > 0 && head_dim <= 256, "launch_attention_decode", "head_dim must be in (0, 256], got " + std::to_string(head_dim));
  require(n_kv_heads > 0 && n_heads % n_kv_heads == 0, "launch_attention_decode",
          "n_heads (" + std::to_string(n_heads) + ") must be a multiple of n_kv_heads (" + std::to_string(n_kv_heads) + ")");
  attention_decode_kernel<<<n_heads, k_threads, 0, stream>>>(q, k_cache, v_cache, scores, out, n_heads, n_kv_heads,
                                                             head_dim, pos, max_len);
  detail::check_launch();
}

}  // namespace servedeck::worker::cuda
