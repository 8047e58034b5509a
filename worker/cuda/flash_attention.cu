// Flash-style causal prefill attention (see flash_attention.cuh) on bf16 tensor cores through
// mma.sync m16n8k16 (PTX ISA, "Matrix fragments for mma.m16n8k16 with floating point type").
//
// Block = (tile of 16 queries, KV head); warp w = query head kv_head·G + w (G = group size), its
// 16 query rows. Key tiles of 64 rows: K and V (fp32 cache) land in a shared staging buffer by
// cp.async while the previous tile is being used, then are split into bf16 hi + lo parts
// (x = hi + lo to ~16 bits) — K row-major, V transposed so that both feed mma B fragments with
// one 32-bit load. Per tile each warp computes S = Q·Kᵀ (16 × 64) in registers as
// Qhi·Khi + Qhi·Klo + Qlo·Khi (fp32-like scores from bf16 tensor cores), updates its rows'
// running max m and sum l, turns S into P = exp(S·scale − m) (bf16, the A fragments of the next
// product come straight from S's accumulator layout), rescales O by exp(m_old − m_new) and adds
// P·Vhi + P·Vlo.
#include "worker/cuda/flash_attention.cuh"

#include <cmath>
#include <cstdint>
#include <string>

#include <cuda_bf16.h>

#include "worker/cuda/launch_check.cuh"

namespace servedeck::worker::cuda {

namespace {

using bf16 = __nv_bfloat16;

constexpr int k_rows = 16;  // queries per warp (mma M)
constexpr int k_keys = 64;  // keys per tile

template <int HD>
struct Layout {
  static constexpr int k_ld = HD + 8;        // bf16 row stride of Khi / Klo: B-fragment loads hit distinct banks
  static constexpr int v_ld = k_keys + 8;    // bf16 row stride of Vᵀhi / Vᵀlo (one row per dimension)
  static constexpr int staging_bytes = 2 * k_keys * HD * 4;  // fp32 K then V rows of one tile
  static constexpr int k_bytes = k_keys * k_ld * 2;
  static constexpr int v_bytes = HD * v_ld * 2;
  static constexpr std::size_t smem = staging_bytes + 2 * k_bytes + 2 * v_bytes;
};

__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
  const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  const int n = valid ? 16 : 0;  // 0: the 16 bytes are zero-filled
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(d), "l"(src), "r"(n) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;" ::: "memory"); }

__device__ __forceinline__ uint32_t pack(bf16 lo_half, bf16 hi_half) {
  return static_cast<uint32_t>(__bfloat16_as_ushort(lo_half)) | (static_cast<uint32_t>(__bfloat16_as_ushort(hi_half)) << 16);
}
/// x = hi + lo with hi = bf16(x), lo = bf16(x − hi): 16 significant bits between them.
__device__ __forceinline__ void split(float x, bf16& hi, bf16& lo) {
  hi = __float2bfloat16(x);
  lo = __float2bfloat16(x - __bfloat162float(hi));
}

/// d += a · b, m16n8k16, bf16 inputs, fp32 accumulators.
__device__ __forceinline__ void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

template <int HD>
__global__ void __launch_bounds__(256) flash_attention_prefill_kernel(const float* __restrict__ q, int ldq,
                                                                      const float* __restrict__ kc,
                                                                      const float* __restrict__ vc, float* __restrict__ out,
                                                                      int ldo, int n, int pos0, int n_kv_heads, float scale) {
  using L = Layout<HD>;
  extern __shared__ __align__(128) unsigned char smem[];
  float* staging = reinterpret_cast<float*>(smem);
  bf16* Kh = reinterpret_cast<bf16*>(smem + L::staging_bytes);
  bf16* Kl = Kh + k_keys * L::k_ld;
  bf16* Vh = Kl + k_keys * L::k_ld;  // transposed: Vh[d · v_ld + key]
  bf16* Vl = Vh + HD * L::v_ld;
  const int G = blockDim.x / 32, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t4 = lane % 4;  // mma fragment coordinates
  const int kvh = blockIdx.y, h = kvh * G + warp, kv_dim = n_kv_heads * HD;
  // Heaviest tiles (most keys) first: the causal work grows with the query index.
  const int q0 = (gridDim.x - 1 - blockIdx.x) * k_rows;
  const int last_key = pos0 + (q0 + k_rows - 1 < n ? q0 + k_rows - 1 : n - 1);
  const int tiles = last_key / k_keys + 1;

  auto stage = [&](int t) {  // K then V rows of tile t into the staging buffer, rows past last_key zero
    for (int e = threadIdx.x; e < 2 * k_keys * (HD / 4); e += blockDim.x) {
      const int which = e / (k_keys * (HD / 4)), rem = e % (k_keys * (HD / 4));
      const int row = rem / (HD / 4), c4 = rem % (HD / 4), key = t * k_keys + row;
      const size_t at = static_cast<size_t>(key <= last_key ? key : 0) * kv_dim + static_cast<size_t>(kvh) * HD + c4 * 4;
      cp_async16(staging + e * 4, (which == 0 ? kc : vc) + at, key <= last_key);
    }
    cp_async_commit();
  };
  stage(0);

  // Q fragments (rows g and g + 8 of the warp's 16, hi and lo parts), straight from global.
  uint32_t qh[HD / 16][4], ql[HD / 16][4];
  {
    const int rows[2] = {q0 + g, q0 + g + 8};
#pragma unroll
    for (int kb = 0; kb < HD / 16; ++kb)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int row = rows[i % 2], col = kb * 16 + t4 * 2 + (i / 2) * 8;
        float2 x = make_float2(0.f, 0.f);
        if (row < n) x = *reinterpret_cast<const float2*>(q + static_cast<size_t>(row) * ldq + static_cast<size_t>(h) * HD + col);
        bf16 h0, l0, h1, l1;
        split(x.x, h0, l0);
        split(x.y, h1, l1);
        qh[kb][i] = pack(h0, h1);
        ql[kb][i] = pack(l0, l1);
      }
  }
  float o[HD / 8][4];
#pragma unroll
  for (int f = 0; f < HD / 8; ++f) o[f][0] = o[f][1] = o[f][2] = o[f][3] = 0.f;
  // Rows g and g + 8; a row past the chunk computes as the chunk's first query (never written).
  const int qpos0 = pos0 + (q0 + g < n ? q0 + g : 0), qpos1 = pos0 + (q0 + g + 8 < n ? q0 + g + 8 : 0);
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;

  for (int t = 0; t < tiles; ++t) {
    cp_async_wait_all();
    __syncthreads();  // tile t is in staging; every warp is done with the previous bf16 tiles
    for (int e = threadIdx.x; e < k_keys * HD; e += blockDim.x) {
      const int row = e / HD, c = e % HD;
      bf16 hi, lo;
      split(staging[e], hi, lo);
      Kh[row * L::k_ld + c] = hi;
      Kl[row * L::k_ld + c] = lo;
      split(staging[k_keys * HD + e], hi, lo);
      Vh[c * L::v_ld + row] = hi;
      Vl[c * L::v_ld + row] = lo;
    }
    __syncthreads();
    if (t + 1 < tiles) stage(t + 1);  // lands while this tile is used
    const int kb0 = t * k_keys;

    // S = Q · Kᵀ: 8 key groups of 8 (n) × head_dim / 16 steps (k).
    float s[k_keys / 8][4];
#pragma unroll
    for (int j = 0; j < k_keys / 8; ++j) {
      s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
      const int key_row = (j * 8 + g) * L::k_ld;
#pragma unroll
      for (int kb = 0; kb < HD / 16; ++kb) {
        const int at = key_row + kb * 16 + t4 * 2;
        const uint32_t bh0 = *reinterpret_cast<const uint32_t*>(Kh + at), bh1 = *reinterpret_cast<const uint32_t*>(Kh + at + 8);
        const uint32_t bl0 = *reinterpret_cast<const uint32_t*>(Kl + at), bl1 = *reinterpret_cast<const uint32_t*>(Kl + at + 8);
        mma(s[j], qh[kb], bh0, bh1);
        mma(s[j], qh[kb], bl0, bl1);
        mma(s[j], ql[kb], bh0, bh1);
      }
    }
    // Online softmax. This thread holds columns j·8 + 2·t4 + {0, 1} of rows g (s[j][0..1]) and
    // g + 8 (s[j][2..3]); the four lanes of a row group complete the row (shuffles over xor 1, 2).
    float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
    for (int j = 0; j < k_keys / 8; ++j)
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int key = kb0 + j * 8 + t4 * 2 + c;
        if (key <= qpos0) mx0 = fmaxf(mx0, s[j][c] * scale);
        if (key <= qpos1) mx1 = fmaxf(mx1, s[j][2 + c] * scale);
      }
#pragma unroll
    for (int x = 1; x <= 2; x <<= 1) {
      mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, x));
      mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, x));
    }
    const float mn0 = fmaxf(m0, mx0), mn1 = fmaxf(m1, mx1);  // finite: key 0 is in every row's first tile
    const float c0 = expf(m0 - mn0), c1 = expf(m1 - mn1);
    m0 = mn0;
    m1 = mn1;
    uint32_t p[k_keys / 16][4];  // A fragments of P (bf16): key block kk = key groups 2kk, 2kk + 1
    float sum0 = 0.f, sum1 = 0.f;
#pragma unroll
    for (int j = 0; j < k_keys / 8; ++j) {
      bf16 pv[4];
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int key = kb0 + j * 8 + t4 * 2 + c;
        pv[c] = __float2bfloat16(key <= qpos0 ? expf(s[j][c] * scale - mn0) : 0.f);
        pv[2 + c] = __float2bfloat16(key <= qpos1 ? expf(s[j][2 + c] * scale - mn1) : 0.f);
        sum0 += __bfloat162float(pv[c]);
        sum1 += __bfloat162float(pv[2 + c]);
      }
      p[j / 2][(j % 2) * 2 + 0] = pack(pv[0], pv[1]);  // row g
      p[j / 2][(j % 2) * 2 + 1] = pack(pv[2], pv[3]);  // row g + 8
    }
#pragma unroll
    for (int x = 1; x <= 2; x <<= 1) {
      sum0 += __shfl_xor_sync(0xffffffffu, sum0, x);
      sum1 += __shfl_xor_sync(0xffffffffu, sum1, x);
    }
    l0 = l0 * c0 + sum0;
    l1 = l1 * c1 + sum1;
    // O = O · corr + P · V over head_dim / 8 column groups (n) × 4 key blocks of 16 (k).
#pragma unroll
    for (int f = 0; f < HD / 8; ++f) {
      o[f][0] *= c0;
      o[f][1] *= c0;
      o[f][2] *= c1;
      o[f][3] *= c1;
      const int d_row = (f * 8 + g) * L::v_ld;
#pragma unroll
      for (int kk = 0; kk < k_keys / 16; ++kk) {
        const int at = d_row + kk * 16 + t4 * 2;
        mma(o[f], p[kk], *reinterpret_cast<const uint32_t*>(Vh + at), *reinterpret_cast<const uint32_t*>(Vh + at + 8));
        mma(o[f], p[kk], *reinterpret_cast<const uint32_t*>(Vl + at), *reinterpret_cast<const uint32_t*>(Vl + at + 8));
      }
    }
  }
  // out = O / l: this thread holds columns f·8 + 2·t4 + {0, 1} of rows g and g + 8.
  const float inv0 = 1.f / l0, inv1 = 1.f / l1;
#pragma unroll
  for (int f = 0; f < HD / 8; ++f) {
    const size_t col = static_cast<size_t>(h) * HD + f * 8 + t4 * 2;
    if (q0 + g < n)
      *reinterpret_cast<float2*>(out + static_cast<size_t>(q0 + g) * ldo + col) = make_float2(o[f][0] * inv0, o[f][1] * inv0);
    if (q0 + g + 8 < n)
      *reinterpret_cast<float2*>(out + static_cast<size_t>(q0 + g + 8) * ldo + col) = make_float2(o[f][2] * inv1, o[f][3] * inv1);
  }
}

template <int HD>
void launch_hd(const float* q, int ldq, const float* kc, const float* vc, float* out, int ldo, int n, int pos0, int n_kv_heads,
               int group, cudaStream_t stream) {
  // Per launch (cheap): the attribute is per device, and a backend may run on any device.
  CUDA_CHECK(cudaFuncSetAttribute(flash_attention_prefill_kernel<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  static_cast<int>(Layout<HD>::smem)));
  const dim3 grid(static_cast<unsigned>((n + k_rows - 1) / k_rows), static_cast<unsigned>(n_kv_heads));
  flash_attention_prefill_kernel<HD><<<grid, 32 * group, Layout<HD>::smem, stream>>>(
      q, ldq, kc, vc, out, ldo, n, pos0, n_kv_heads, 1.f / std::sqrt(static_cast<float>(HD)));
  detail::check_launch();
}

}  // namespace

bool flash_attention_supported(int n_heads, int n_kv_heads, int head_dim) {
  return (head_dim == 32 || head_dim == 64 || head_dim == 128) && n_kv_heads > 0 && n_heads % n_kv_heads == 0 &&
         n_heads / n_kv_heads >= 1 && n_heads / n_kv_heads <= 8;
}

void launch_flash_attention_prefill(const float* q, int ldq, const float* k_cache, const float* v_cache, float* out, int ldo,
                                    int n, int pos0, int n_heads, int n_kv_heads, int head_dim, cudaStream_t stream) {
  using detail::require;
  require(flash_attention_supported(n_heads, n_kv_heads, head_dim), "launch_flash_attention_prefill",
          "head_dim must be 32, 64 or 128 and n_heads a multiple of n_kv_heads with n_heads / n_kv_heads in [1, 8], got head_dim " +
              std::to_string(head_dim) + ", heads " + std::to_string(n_heads) + " / " + std::to_string(n_kv_heads));
  require(n_kv_heads <= 65535, "launch_flash_attention_prefill", "n_kv_heads must be <= 65535, got " + std::to_string(n_kv_heads));
  require(n > 0 && pos0 >= 0, "launch_flash_attention_prefill",
          "n must be positive and pos0 non-negative, got " + std::to_string(n) + ", " + std::to_string(pos0));
  require(ldq >= n_heads * head_dim && ldo >= n_heads * head_dim && ldq % 2 == 0 && ldo % 2 == 0, "launch_flash_attention_prefill",
          "ldq and ldo must be even and >= n_heads * head_dim (" + std::to_string(n_heads * head_dim) + "), got " +
              std::to_string(ldq) + ", " + std::to_string(ldo));
  require(detail::aligned16(k_cache) && detail::aligned16(v_cache), "launch_flash_attention_prefill",
          "the caches must be 16-byte aligned");
  require(reinterpret_cast<std::uintptr_t>(q) % 8 == 0 && reinterpret_cast<std::uintptr_t>(out) % 8 == 0,
          "launch_flash_attention_prefill", "q and out must be 8-byte aligned (read and written as float2)");
  const int group = n_heads / n_kv_heads;
  switch (head_dim) {
    case 32: launch_hd<32>(q, ldq, k_cache, v_cache, out, ldo, n, pos0, n_kv_heads, group, stream); break;
    case 64: launch_hd<64>(q, ldq, k_cache, v_cache, out, ldo, n, pos0, n_kv_heads, group, stream); break;
    default: launch_hd<128>(q, ldq, k_cache, v_cache, out, ldo, n, pos0, n_kv_heads, group, stream); break;
  }
}

}  // namespace servedeck::worker::cuda
