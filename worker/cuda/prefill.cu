// Prefill-chunk kernels (see prefill.cuh).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include "worker/cuda/dot.cuh"
#include "worker/cuda/launch_check.cuh"
#include "worker/cuda/router_select.cuh"
#include "worker/cuda/prefill.cuh"

namespace servedeck::worker::cuda {

namespace {

using bf16 = __nv_bfloat16;
using detail::warp_argmax;
using detail::warp_max;
using detail::warp_softmax_inplace;
using detail::warp_sum;

__global__ void embed_rows_kernel(const bf16* __restrict__ table, const int32_t* __restrict__ tokens, float* __restrict__ x,
                                  int hidden) {
  const bf16* row = table + static_cast<size_t>(tokens[blockIdx.x]) * hidden;
  float* xr = x + static_cast<size_t>(blockIdx.x) * hidden;
  for (int i = threadIdx.x; i < hidden; i += blockDim.x) xr[i] = __bfloat162float(row[i]);
}

// One block of 256 threads per row; fixed-order reduction (warps, then warp sums in order).
__global__ void rmsnorm_rows_bf16_kernel(const float* __restrict__ x, const bf16* __restrict__ w, bf16* __restrict__ y,
                                         float* __restrict__ y32, int dim, float eps) {
  __shared__ float red[8];
  const float* xr = x + static_cast<size_t>(blockIdx.x) * dim;
  bf16* yr = y + static_cast<size_t>(blockIdx.x) * dim;
  float ss = 0.f;
  for (int i = threadIdx.x; i < dim; i += 256) ss += xr[i] * xr[i];
  ss = warp_sum(ss);
  if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = ss;
  __syncthreads();
  float tot = 0.f;
#pragma unroll
  for (int k = 0; k < 8; ++k) tot += red[k];
  const float inv = rsqrtf(tot / dim + eps);
  float* y32r = y32 != nullptr ? y32 + static_cast<size_t>(blockIdx.x) * dim : nullptr;
  for (int i = threadIdx.x; i < dim; i += 256) {
    const float v = xr[i] * inv * __bfloat162float(w[i]);
    yr[i] = __float2bfloat16(v);
    if (y32r != nullptr) y32r[i] = v;
  }
}

// logits[t, e] = R[e, :] · xn[t, :] with fp32 activations (as the decode router), one block per
// token, one warp per expert row at a time.
__global__ void router_logits_rows_kernel(const bf16* __restrict__ R, const float* __restrict__ xn, float* __restrict__ logits,
                                          int n, int hidden) {
  const int lane = threadIdx.x % 32;
  const float* x = xn + static_cast<size_t>(blockIdx.x) * hidden;
  for (int e = threadIdx.x / 32; e < n; e += blockDim.x / 32) {
    const float v = warp_sum(detail::lane_dot(R + static_cast<size_t>(e) * hidden, x, hidden, lane));
    if (lane == 0) logits[static_cast<size_t>(blockIdx.x) * n + e] = v;
  }
}

// The same product tiled for long chunks: a block computes 64 tokens × 64 experts, each thread
// 4 × 4 of them, through shared-memory tiles of 32 hidden columns (xn as is, R rounded up to
// fp32), so R is read once per 64 tokens instead of once per token (the per-token kernel above
// read 8.6 GB of R per layer at 16k tokens on the Qwen3-30B-A3B shape). Each output sums its
// hidden columns in order, in fp32.
constexpr int k_rl_tokens = 64, k_rl_experts = 64, k_rl_cols = 32;

__global__ void __launch_bounds__(256) router_logits_tiled_kernel(const bf16* __restrict__ R, const float* __restrict__ xn,
                                                                  float* __restrict__ logits, int rows, int n, int hidden) {
  __shared__ __align__(16) float xs[k_rl_cols][k_rl_tokens + 4];   // [column][token]
  __shared__ __align__(16) float rs[k_rl_cols][k_rl_experts + 4];  // [column][expert]
  const int t0 = blockIdx.x * k_rl_tokens, e0 = blockIdx.y * k_rl_experts;
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;  // experts tx·4 + j, tokens ty·4 + i
  float acc[4][4] = {};
  for (int c0 = 0; c0 < hidden; c0 += k_rl_cols) {
    for (int i = threadIdx.x; i < k_rl_tokens * k_rl_cols / 4; i += blockDim.x) {
      const int t = i / (k_rl_cols / 4), c4 = i % (k_rl_cols / 4);
      float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
      if (t0 + t < rows) v = *reinterpret_cast<const float4*>(xn + static_cast<size_t>(t0 + t) * hidden + c0 + c4 * 4);
      xs[c4 * 4 + 0][t] = v.x;
      xs[c4 * 4 + 1][t] = v.y;
      xs[c4 * 4 + 2][t] = v.z;
      xs[c4 * 4 + 3][t] = v.w;
    }
    {  // 64 experts × 32 columns of bf16: one 16-byte load per thread
      const int e = threadIdx.x / 4, c8 = threadIdx.x % 4;
      uint4 raw = make_uint4(0u, 0u, 0u, 0u);
      if (e0 + e < n) raw = *reinterpret_cast<const uint4*>(R + static_cast<size_t>(e0 + e) * hidden + c0 + c8 * 8);
      const bf16* b = reinterpret_cast<const bf16*>(&raw);
#pragma unroll
      for (int c = 0; c < 8; ++c) rs[c8 * 8 + c][e] = __bfloat162float(b[c]);
    }
    __syncthreads();
#pragma unroll 8
    for (int c = 0; c < k_rl_cols; ++c) {
      const float4 a = *reinterpret_cast<const float4*>(&xs[c][ty * 4]);
      const float4 b = *reinterpret_cast<const float4*>(&rs[c][tx * 4]);
      const float av[4] = {a.x, a.y, a.z, a.w}, bv[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int t = t0 + ty * 4 + i, e = e0 + tx * 4 + j;
      if (t < rows && e < n) logits[static_cast<size_t>(t) * n + e] = acc[i][j];
    }
}

// grid (rows, ceil((n_heads + n_kv_heads) / 8)), block (32, 8): one warp per head of the row
// (norm + RoPE in place; k heads also append k and v). Eight heads per block, not one: a 16k-row
// chunk is 82k blocks instead of 655k.
constexpr int k_rope_heads_per_block = 8;
__global__ void qk_rope_append_kernel(float* qkv, const bf16* qn, const bf16* kn, PagedKv kv, AttentionShape s, int pos0,
                                      const float* __restrict__ bias) {
  const int r = blockIdx.x, head = blockIdx.y * blockDim.y + threadIdx.y, lane = threadIdx.x, hd = s.head_dim;
  if (head >= s.n_heads + s.n_kv_heads) return;  // the whole warp: the helpers below sync per warp only
  const int q_dim = s.n_heads * hd, kv_dim = s.n_kv_heads * hd, width = q_dim + 2 * kv_dim;
  float* row = qkv + static_cast<size_t>(r) * width;
  const int pos = pos0 + r;
  // The q|k|v bias (glm4_moe), before the norm: element i of a head is lane i % 32's.
  auto add_bias = [&](float* x, int at) {
    if (bias == nullptr) return;
    for (int i = lane; i < hd; i += 32) x[i] += bias[at + i];
    __syncwarp();
  };
  if (head < s.n_heads) {
    float* v = row + static_cast<size_t>(head) * hd;
    add_bias(v, head * hd);
    detail::norm_rope_head(v, qn, v, hd, s.rotary_dim, s.eps, s.inv_freq, pos, lane);
  } else {
    const int kvh = head - s.n_heads;
    float* k = row + q_dim + static_cast<size_t>(kvh) * hd;
    add_bias(k, q_dim + kvh * hd);
    detail::norm_rope_head(k, kn, k, hd, s.rotary_dim, s.eps, s.inv_freq, pos, lane);
    const float* v = row + q_dim + kv_dim + static_cast<size_t>(kvh) * hd;
    const float* vb = bias != nullptr ? bias + q_dim + kv_dim + kvh * hd : nullptr;
    const int B = kv.block_tokens;
    const size_t at = (static_cast<size_t>(kv.table[pos / B]) * B + pos % B) * kv_dim + static_cast<size_t>(kvh) * hd;
    for (int i = lane; i < hd; i += 32) {
      kv.k[at + i] = __float2bfloat16_rn(k[i]);
      kv.v[at + i] = __float2bfloat16_rn(vb != nullptr ? v[i] + vb[i] : v[i]);
    }
  }
}

__global__ void causal_softmax_kernel(float* scores, int queries, int len, int ld, int pos0) {
  __shared__ float red[8];
  float* row = scores + static_cast<size_t>(blockIdx.x) * ld;
  const int i = blockIdx.x % queries;
  const int valid = min(len, pos0 + i + 1);
  float m = -INFINITY;
  for (int t = threadIdx.x; t < valid; t += 256) m = fmaxf(m, row[t]);
  m = warp_max(m);
  if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = m;
  __syncthreads();
  float M = -INFINITY;
#pragma unroll
  for (int k = 0; k < 8; ++k) M = fmaxf(M, red[k]);
  __syncthreads();
  float s = 0.f;
  for (int t = threadIdx.x; t < valid; t += 256) {
    const float e = expf(row[t] - M);
    row[t] = e;
    s += e;
  }
  s = warp_sum(s);
  if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = s;
  __syncthreads();
  float S = 0.f;
#pragma unroll
  for (int k = 0; k < 8; ++k) S += red[k];
  const float inv = 1.f / S;
  for (int t = threadIdx.x; t < len; t += 256) row[t] = t < valid ? row[t] * inv : 0.f;
}

// One block per position: its K and V rows (kv_dim bf16 each, 16 bytes per thread and step)
// from the pool to row `pos` of contiguous buffers, as bf16 or widened to fp32.
template <class T>
__global__ void gather_kv_rows_kernel(PagedKv kv, int kv_dim, T* __restrict__ k_out, T* __restrict__ v_out) {
  const int pos = blockIdx.x, B = kv.block_tokens;
  const size_t src = (static_cast<size_t>(kv.table[pos / B]) * B + pos % B) * kv_dim;
  const size_t dst = static_cast<size_t>(pos) * kv_dim;
  for (int c = threadIdx.x * 8; c < kv_dim; c += blockDim.x * 8) {
    const uint4 kr = *reinterpret_cast<const uint4*>(kv.k + src + c);
    const uint4 vr = *reinterpret_cast<const uint4*>(kv.v + src + c);
    if constexpr (sizeof(T) == 2) {
      *reinterpret_cast<uint4*>(k_out + dst + c) = kr;
      *reinterpret_cast<uint4*>(v_out + dst + c) = vr;
    } else {
      const bf16* kh = reinterpret_cast<const bf16*>(&kr);
      const bf16* vh = reinterpret_cast<const bf16*>(&vr);
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        k_out[dst + c + j] = __bfloat162float(kh[j]);
        v_out[dst + c + j] = __bfloat162float(vh[j]);
      }
    }
  }
}

__global__ void to_bf16_kernel(const float* __restrict__ x, bf16* __restrict__ y, size_t n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n; i += static_cast<size_t>(gridDim.x) * blockDim.x)
    y[i] = __float2bfloat16(x[i]);
}

// One warp per row: softmax, k rounds of arg-max (ties → lower id), optional renormalisation.
__global__ void router_rows_kernel(const float* __restrict__ logits, int rows, int n, int k, int renormalise, int32_t* ids,
                                   float* weights, const uint8_t* hot_flags, unsigned long long* counters,
                                   unsigned long long* layer_counts) {
  __shared__ float ps[4][1024];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int r = blockIdx.x * 4 + warp;
  if (r >= rows) return;
  float* p = ps[warp];
  const float* lr = logits + static_cast<size_t>(r) * n;
  for (int e = lane; e < n; e += 32) p[e] = lr[e];
  warp_softmax_inplace(p, n, lane);
  float chosen_sum = 0.f, chosen[32];
  int chosen_id[32];
  for (int j = 0; j < k; ++j) {
    float bv;
    int bi;
    warp_argmax(p, n, lane, bv, bi);
    if (lane == 0) p[bi] = -1.f;
    chosen[j & 31] = bv;
    chosen_id[j & 31] = bi;
    chosen_sum += bv;
    __syncwarp();
  }
  if (lane == 0) {
    for (int j = 0; j < k; ++j) {
      ids[static_cast<size_t>(r) * k + j] = chosen_id[j];
      weights[static_cast<size_t>(r) * k + j] = renormalise ? chosen[j] / chosen_sum : chosen[j];
      atomicAdd(&counters[hot_flags[chosen_id[j]] ? 0 : 1], 1ull);
      atomicAdd(&layer_counts[chosen_id[j]], 1ull);
    }
  }
}

// Grid-stride over all rows × 16-byte pieces (a block per row made 131k blocks at 16k tokens).
__global__ void gather_rows_kernel(const bf16* __restrict__ x, const int32_t* __restrict__ src, bf16* __restrict__ xp,
                                   int rows, int dim) {
  const size_t per_row = static_cast<size_t>(dim / 8), n = static_cast<size_t>(rows) * per_row;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n; i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const size_t p = i / per_row, c = i % per_row;
    reinterpret_cast<uint4*>(xp)[i] = reinterpret_cast<const uint4*>(x + static_cast<size_t>(src[p]) * dim)[c];
  }
}

// Grid-stride over all rows × inter elements (as the gather).
__global__ void swiglu_rows_kernel(const float* __restrict__ gu, bf16* __restrict__ act, int rows, int inter) {
  const size_t n = static_cast<size_t>(rows) * inter;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n; i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const size_t p = i / inter, c = i % inter;
    const float* row = gu + p * 2 * inter;
    const float g = row[c];
    act[i] = __float2bfloat16(g / (1.f + expf(-g)) * row[inter + c]);
  }
}

__global__ void moe_reduce_rows_kernel(const float* __restrict__ partial, const int32_t* __restrict__ slot,
                                       const float* __restrict__ weights, int k, int hidden, float* __restrict__ x) {
  const int t = blockIdx.x;
  float* xr = x + static_cast<size_t>(t) * hidden;
  for (int h = threadIdx.x; h < hidden; h += blockDim.x) {
    float acc = 0.f;
    for (int j = 0; j < k; ++j)
      acc += weights[static_cast<size_t>(t) * k + j] * partial[static_cast<size_t>(slot[static_cast<size_t>(t) * k + j]) * hidden + h];
    xr[h] += acc;
  }
}

}  // namespace

void launch_embed_rows(const bf16* table, const int32_t* tokens, float* x, int rows, int hidden, cudaStream_t stream) {
  detail::require(rows > 0 && hidden > 0, "launch_embed_rows", "rows and hidden must be positive");
  embed_rows_kernel<<<rows, 256, 0, stream>>>(table, tokens, x, hidden);
  detail::check_launch();
}

void launch_rmsnorm_rows_bf16(const float* x, const bf16* w, bf16* y, int rows, int dim, float eps, cudaStream_t stream,
                              float* y32) {
  detail::require(rows > 0 && dim > 0, "launch_rmsnorm_rows_bf16", "rows and dim must be positive");
  rmsnorm_rows_bf16_kernel<<<rows, 256, 0, stream>>>(x, w, y, y32, dim, eps);
  detail::check_launch();
}

void launch_qk_rope_append_rows(float* qkv, const bf16* q_norm, const bf16* k_norm, const PagedKv& kv, const AttentionShape& s,
                                int rows, int pos0, cudaStream_t stream, const float* bias) {
  detail::require(s.head_dim > 0 && s.head_dim <= 256 && rows > 0, "launch_qk_rope_append_rows",
                  "head_dim must be in (0, 256] and rows positive, got " + std::to_string(s.head_dim) + ", " + std::to_string(rows));
  detail::require(s.rotary_dim >= 0 && s.rotary_dim <= s.head_dim && s.rotary_dim % 2 == 0, "launch_qk_rope_append_rows",
                  "rotary_dim must be even and in [0, head_dim], got " + std::to_string(s.rotary_dim));
  const unsigned head_blocks = static_cast<unsigned>((s.n_heads + s.n_kv_heads + k_rope_heads_per_block - 1) / k_rope_heads_per_block);
  qk_rope_append_kernel<<<dim3(static_cast<unsigned>(rows), head_blocks), dim3(32, k_rope_heads_per_block), 0, stream>>>(
      qkv, q_norm, k_norm, kv, s, pos0, bias);
  detail::check_launch();
}

namespace {

template <class T>
void gather_kv(const PagedKv& kv, int kv_dim, int rows, T* k_out, T* v_out, cudaStream_t stream) {
  detail::require(rows > 0 && kv_dim > 0 && kv_dim % 8 == 0 && kv.block_tokens > 0 && kv.table != nullptr, "launch_gather_kv_rows",
                  "need rows > 0, kv_dim a positive multiple of 8, block_tokens > 0 and a block table; got rows " +
                      std::to_string(rows) + ", kv_dim " + std::to_string(kv_dim) + ", block_tokens " + std::to_string(kv.block_tokens));
  detail::require(detail::aligned16(kv.k) && detail::aligned16(kv.v) && detail::aligned16(k_out) && detail::aligned16(v_out),
                  "launch_gather_kv_rows", "the pool and the outputs must be 16-byte aligned");
  const int threads = std::min(256, std::max(32, (kv_dim / 8 + 31) / 32 * 32));
  gather_kv_rows_kernel<T><<<static_cast<unsigned>(rows), static_cast<unsigned>(threads), 0, stream>>>(kv, kv_dim, k_out, v_out);
  detail::check_launch();
}

}  // namespace

void launch_gather_kv_rows(const PagedKv& kv, int kv_dim, int rows, bf16* k_out, bf16* v_out, cudaStream_t stream) {
  gather_kv(kv, kv_dim, rows, k_out, v_out, stream);
}

void launch_gather_kv_rows(const PagedKv& kv, int kv_dim, int rows, float* k_out, float* v_out, cudaStream_t stream) {
  gather_kv(kv, kv_dim, rows, k_out, v_out, stream);
}

void launch_causal_softmax_rows(float* scores, int rows, int queries, int len, int ld, int pos0_first_query,
                                cudaStream_t stream) {
  detail::require(rows > 0 && queries > 0 && len > 0 && len <= ld, "launch_causal_softmax_rows",
                  "need rows, queries > 0 and 0 < len <= ld, got len " + std::to_string(len) + ", ld " + std::to_string(ld));
  causal_softmax_kernel<<<rows, 256, 0, stream>>>(scores, queries, len, ld, pos0_first_query);
  detail::check_launch();
}

__global__ void moe_scatter_rows_kernel(const int32_t* __restrict__ ids, const int32_t* __restrict__ rank,
                                        const int32_t* __restrict__ offset, int rows, int k, int n_experts, int32_t* __restrict__ slot,
                                        int32_t* __restrict__ src) {
  extern __shared__ int32_t off_s[];
  for (int e = threadIdx.x; e < n_experts; e += blockDim.x) off_s[e] = offset[e];
  __syncthreads();
  for (int p = blockIdx.x * blockDim.x + threadIdx.x; p < rows; p += gridDim.x * blockDim.x) {
    const int at = off_s[ids[p]] + rank[p];
    slot[p] = at;
    src[at] = p / k;
  }
}

void launch_moe_scatter_rows(const int32_t* ids, const int32_t* rank, const int32_t* offset, int rows, int k, int n_experts,
                             int32_t* slot, int32_t* src, cudaStream_t stream) {
  detail::require(rows >= 0 && k > 0 && n_experts > 0 && n_experts <= 4096, "launch_moe_scatter_rows",
                  "rows must be >= 0, k positive and n_experts in (0, 4096], got " + std::to_string(rows) + ", " + std::to_string(k) +
                      ", " + std::to_string(n_experts));
  if (rows == 0) return;
  const int blocks = std::min((rows + 255) / 256, 512);
  moe_scatter_rows_kernel<<<blocks, 256, static_cast<std::size_t>(n_experts) * sizeof(int32_t), stream>>>(ids, rank, offset, rows, k,
                                                                                                          n_experts, slot, src);
  detail::check_launch();
}

void launch_to_bf16(const float* x, bf16* y, std::size_t n, cudaStream_t stream) {
  const std::size_t blocks = std::min<std::size_t>((n + 255) / 256, 4096);
  to_bf16_kernel<<<static_cast<unsigned>(blocks), 256, 0, stream>>>(x, y, n);
  detail::check_launch();
}

void launch_router_topk_rows(const float* logits, int rows, int n, int k, bool renormalise, int32_t* ids, float* weights,
                             const uint8_t* hot_flags, unsigned long long* counters, unsigned long long* layer_counts,
                             cudaStream_t stream) {
  detail::require(n > 0 && n <= 1024 && k > 0 && k <= n && k <= 32, "launch_router_topk_rows",
                  "need 0 < k <= min(n, 32) and n <= 1024, got n " + std::to_string(n) + ", k " + std::to_string(k));
  router_rows_kernel<<<(rows + 3) / 4, 128, 0, stream>>>(logits, rows, n, k, renormalise ? 1 : 0, ids, weights, hot_flags,
                                                        counters, layer_counts);
  detail::check_launch();
}

void launch_router_logits_rows(const bf16* R, const float* xn, float* logits, int rows, int n_experts, int hidden,
                               cudaStream_t stream) {
  detail::require(rows > 0 && n_experts > 0 && hidden % 8 == 0, "launch_router_logits_rows",
                  "need rows > 0, n_experts > 0 and hidden % 8 == 0, got rows " + std::to_string(rows) + ", n_experts " +
                      std::to_string(n_experts) + ", hidden " + std::to_string(hidden));
  // The tiled kernel for any row count (when hidden allows), so a chunk's rows get the same sums
  // whether they are routed in one part or two.
  if (hidden % k_rl_cols == 0) {
    detail::require(detail::aligned16(R) && detail::aligned16(xn), "launch_router_logits_rows",
                    "R and xn must be 16-byte aligned (read as uint4 / float4), got addresses % 16 = " +
                        std::to_string(reinterpret_cast<std::uintptr_t>(R) % 16) + " and " +
                        std::to_string(reinterpret_cast<std::uintptr_t>(xn) % 16));
    const dim3 grid(static_cast<unsigned>((rows + k_rl_tokens - 1) / k_rl_tokens), static_cast<unsigned>((n_experts + k_rl_experts - 1) / k_rl_experts));
    router_logits_tiled_kernel<<<grid, 256, 0, stream>>>(R, xn, logits, rows, n_experts, hidden);
  } else {
    router_logits_rows_kernel<<<rows, 256, 0, stream>>>(R, xn, logits, n_experts, hidden);
  }
  detail::check_launch();
}

void launch_gather_rows_bf16(const bf16* x, const int32_t* src, bf16* xp, int rows, int dim, cudaStream_t stream) {
  detail::require(dim % 8 == 0, "launch_gather_rows_bf16", "dim must be a multiple of 8, got " + std::to_string(dim));
  if (rows == 0) return;
  const std::size_t pieces = static_cast<std::size_t>(rows) * static_cast<std::size_t>(dim / 8);
  gather_rows_kernel<<<static_cast<unsigned>(std::min<std::size_t>((pieces + 255) / 256, 4096)), 256, 0, stream>>>(x, src, xp, rows, dim);
  detail::check_launch();
}

void launch_swiglu_rows_bf16(const float* gu, bf16* act, int rows, int inter, cudaStream_t stream) {
  if (rows == 0) return;
  const std::size_t n = static_cast<std::size_t>(rows) * static_cast<std::size_t>(inter);
  swiglu_rows_kernel<<<static_cast<unsigned>(std::min<std::size_t>((n + 255) / 256, 4096)), 256, 0, stream>>>(gu, act, rows, inter);
  detail::check_launch();
}

void launch_moe_reduce_rows(const float* partial, const int32_t* slot, const float* weights, int rows, int k, int hidden,
                            float* x, cudaStream_t stream) {
  detail::require(rows > 0 && k > 0, "launch_moe_reduce_rows", "rows and k must be positive");
  moe_reduce_rows_kernel<<<rows, 256, 0, stream>>>(partial, slot, weights, k, hidden, x);
  detail::check_launch();
}

}  // namespace servedeck::worker::cuda
