// Flash-style causal prefill attention (see flash_attention.cuh) on bf16 tensor cores through
// mma.sync m16n8k16 and ldmatrix (PTX ISA, "Matrix fragments for mma.m16n8k16 with floating
// point type", "ldmatrix"); the loop follows FlashAttention-2 (Dao, 2023): queries stay in
// registers, key/value tiles stream through shared memory, softmax is online.
//
// Block = (tile of 16 queries, KV head); warp w = query head kv_head·G + w (G = group size), its
// 16 query rows, so each key/value tile read into shared memory serves 16·G query rows. Key
// tiles of 64 rows of the bf16 K and V copies land by cp.async in one of two buffers while the
// other is used. Per tile each warp computes S = Q·Kᵀ (16 × 64) in registers (K fragments by
// ldmatrix from row-major K), updates its rows' running max m and sum l in the log2 domain,
// turns S into P = 2^(S·scale·log2 e − m) in bf16 (the A fragments of the next product come
// straight from S's accumulator layout), rescales O by 2^(m_old − m_new) and adds P·V (V
// fragments by ldmatrix.trans from row-major V). Only tiles that reach past a row's position
// are masked.
//
// The variants (FlashVariant, flash_attention.cuh): baseline, one_barrier and two_blocks share
// flash_attention_prefill_kernel and differ in the barriers per tile (two or one) and where Q
// lives (registers, or the block's shared memory read by ldmatrix per k step so that a thread
// fits in 128 registers and two blocks share an SM); wide_rows and wide_split run
// flash_attention_wide_kernel, whose warps own 32 query rows (two m16 tiles) so each K/V
// fragment read from shared memory feeds two mma. All use SoftmaxRows for the softmax step.
#include "worker/cuda/flash_attention.cuh"

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "worker/cuda/launch_check.cuh"

namespace servedeck::worker::cuda {

namespace {

using bf16 = __nv_bfloat16;

constexpr int k_rows = 16;  // queries per warp (mma M)
constexpr int k_keys = 64;  // keys per tile

template <int HD>
struct Layout {
  static constexpr int ld = HD + 8;  // bf16 row stride: the 8 rows of an ldmatrix fall in distinct banks
  static constexpr int tile = k_keys * ld;  // bf16 elements of one K or V tile
  static constexpr std::size_t smem = static_cast<std::size_t>(2 * 2 * tile) * 2;  // 2 buffers × (K, V)
  /// two_blocks: K/V buffers, then Q of the group's `group` heads (16 rows of ld each, bf16).
  static std::size_t smem_q_shared(int group) { return smem + static_cast<std::size_t>(group * k_rows * ld) * 2; }
};

__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
  const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  const int n = valid ? 16 : 0;  // 0: the 16 bytes are zero-filled
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(d), "l"(src), "r"(n) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }

/// Four 8×8 bf16 matrices; lane l gives the address of row l % 8 of matrix l / 8.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const bf16* row) {
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}
/// As ldmatrix_x4, from a shared-state-space address (__cvta_generic_to_shared).
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], unsigned a) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}
/// Two 8×8 bf16 matrices from a shared-state-space address; lane l < 16 gives the address of row
/// l % 8 of matrix l / 8 (lanes 16..31: their addresses are ignored).
__device__ __forceinline__ void ldmatrix_x2(uint32_t (&r)[2], unsigned a) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];" : "=r"(r[0]), "=r"(r[1]) : "r"(a));
}
/// As ldmatrix_x4, each matrix transposed.
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const bf16* row) {
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}

__device__ __forceinline__ uint32_t pack(float lo_half, float hi_half) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo_half, hi_half);  // .x = lo_half (low 16 bits)
  return *reinterpret_cast<const uint32_t*>(&v);
}

/// d += a · b, m16n8k16, bf16 inputs, fp32 accumulators.
__device__ __forceinline__ void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/// One warp's running softmax state for the rows g and g + 8 of an m16 tile (this lane's), in
/// the log2 domain: max m, sum l of the bf16-rounded weights, and the rows' query positions.
struct SoftmaxRows {
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;
  int qpos0 = 0, qpos1 = 0;

  /// Folds the 16 × (8·NJ) score tile s (Q·Kᵀ, unscaled; keys kb0 ..) into the state: masks
  /// keys past a row's position when `masked`, scales by scale_log2, sets p to the bf16 A
  /// fragments of P = 2^(S − m_new) and c0, c1 to 2^(m_old − m_new) (the factor O must be
  /// rescaled by).
  template <int NJ>
  __device__ __forceinline__ void tile(float (&s)[NJ][4], int kb0, bool masked, int t4, float scale_log2, uint32_t (&p)[NJ / 2][4],
                                       float& c0, float& c1) {
    // Online softmax in the log2 domain. This thread holds columns j·8 + 2·t4 + {0, 1} of rows g
    // (s[j][0..1]) and g + 8 (s[j][2..3]); the four lanes of a row complete it (shuffles xor 1, 2).
#pragma unroll
    for (int j = 0; j < NJ; ++j)
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int key = kb0 + j * 8 + t4 * 2 + c;
        s[j][c] = masked && key > qpos0 ? -INFINITY : s[j][c] * scale_log2;
        s[j][2 + c] = masked && key > qpos1 ? -INFINITY : s[j][2 + c] * scale_log2;
      }
    float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
    for (int j = 0; j < NJ; ++j) {
      mx0 = fmaxf(mx0, fmaxf(s[j][0], s[j][1]));
      mx1 = fmaxf(mx1, fmaxf(s[j][2], s[j][3]));
    }
#pragma unroll
    for (int x = 1; x <= 2; x <<= 1) {
      mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, x));
      mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, x));
    }
    const float mn0 = fmaxf(m0, mx0), mn1 = fmaxf(m1, mx1);  // finite: key 0 is in every row's first tile
    c0 = exp2f(m0 - mn0);
    c1 = exp2f(m1 - mn1);
    m0 = mn0;
    m1 = mn1;
    float sum0 = 0.f, sum1 = 0.f;
#pragma unroll
    for (int j = 0; j < NJ; ++j) {
      // Masked scores are −inf: 2^(−inf) = 0. The sums add the bf16-rounded values, so each row's
      // weights sum to exactly what multiplies v.
      const __nv_bfloat162 r0 = __floats2bfloat162_rn(exp2f(s[j][0] - mn0), exp2f(s[j][1] - mn0));
      const __nv_bfloat162 r1 = __floats2bfloat162_rn(exp2f(s[j][2] - mn1), exp2f(s[j][3] - mn1));
      sum0 += __low2float(r0) + __high2float(r0);
      sum1 += __low2float(r1) + __high2float(r1);
      p[j / 2][(j % 2) * 2 + 0] = *reinterpret_cast<const uint32_t*>(&r0);  // row g
      p[j / 2][(j % 2) * 2 + 1] = *reinterpret_cast<const uint32_t*>(&r1);  // row g + 8
    }
#pragma unroll
    for (int x = 1; x <= 2; x <<= 1) {
      sum0 += __shfl_xor_sync(0xffffffffu, sum0, x);
      sum1 += __shfl_xor_sync(0xffffffffu, sum1, x);
    }
    l0 = l0 * c0 + sum0;
    l1 = l1 * c1 + sum1;
  }
};

/// Baseline: the warp's Q fragments (rows g and g + 8 of its 16) in bf16 registers, read once
/// from global; 4 registers per k step of 16 dims (32 at head_dim 128).
template <int HD, bool QS>
struct QTile {
  uint32_t f[HD / 16][4];

  __device__ __forceinline__ void load(const float* q, int ldq, int q0, int n, int h, int lane, bf16* /*rows*/) {
    const int g = lane / 4, t4 = lane % 4;
#pragma unroll
    for (int kb = 0; kb < HD / 16; ++kb)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int row = q0 + g + (i % 2) * 8, col = kb * 16 + t4 * 2 + (i / 2) * 8;
        float2 x = make_float2(0.f, 0.f);
        if (row < n) x = *reinterpret_cast<const float2*>(q + static_cast<size_t>(row) * ldq + static_cast<size_t>(h) * HD + col);
        f[kb][i] = pack(x.x, x.y);
      }
  }

  /// s = Q · Kᵀ over the 64 keys of Kt: 8 key groups of 8 (n) × head_dim / 16 steps (k); one
  /// ldmatrix.x4 gives the B fragments of two k steps (matrices: dims +0, +8, +16, +24 of 8 keys).
  __device__ __forceinline__ void scores(float (&s)[k_keys / 8][4], const bf16* Kt, int lane) const {
    const int lm = lane / 8, lr = lane % 8;
#pragma unroll
    for (int j = 0; j < k_keys / 8; ++j) {
      s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
#pragma unroll
      for (int kb = 0; kb < HD / 16; kb += 2) {
        uint32_t b[4];
        ldmatrix_x4(b, Kt + (j * 8 + lr) * Layout<HD>::ld + kb * 16 + lm * 8);
        mma(s[j], f[kb], b[0], b[1]);
        mma(s[j], f[kb + 1], b[2], b[3]);
      }
    }
  }
};

/// two_blocks: the warp's 16 Q rows in shared memory (bf16, row stride Layout::ld), written once
/// by the warp itself; A fragments by ldmatrix.x4 (matrices: rows +0 / +8 × dims +0 / +8 of a k
/// step, i.e. a0..a3 of the m16n8k16 A layout), so no registers hold Q between k steps.
template <int HD>
struct QTile<HD, true> {
  unsigned rows = 0;  // shared-state-space address of row 0 (32 bits: fewer registers than a pointer)

  __device__ __forceinline__ void load(const float* q, int ldq, int q0, int n, int h, int lane, bf16* dst) {
    constexpr int pairs = HD / 2;  // float2 per row
    for (int e = lane; e < k_rows * pairs; e += 32) {
      const int r = e / pairs, c = (e % pairs) * 2;
      float2 x = make_float2(0.f, 0.f);
      if (q0 + r < n) x = *reinterpret_cast<const float2*>(q + static_cast<size_t>(q0 + r) * ldq + static_cast<size_t>(h) * HD + c);
      *reinterpret_cast<uint32_t*>(dst + r * Layout<HD>::ld + c) = pack(x.x, x.y);
    }
    __syncwarp();  // each lane's ldmatrix reads rows other lanes wrote
    rows = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  }

  /// As QTile<HD, false>::scores, k steps outermost: per k step one ldmatrix.x4 of Q (the A
  /// fragment), then per key group one ldmatrix.x2 of K (matrices: dims +0, +8 of 8 keys, the
  /// B fragment) feeding one mma; x2 rather than the baseline's x4 over two k steps keeps 6
  /// fewer registers live (128 without spills). Each s[j] still accumulates its k steps in
  /// ascending order, as the baseline does.
  __device__ __forceinline__ void scores(float (&s)[k_keys / 8][4], const bf16* Kt, int lane) const {
    constexpr int bytes_per_row = Layout<HD>::ld * 2;
    const int lm = lane / 8, lr = lane % 8;
    const unsigned qrow = rows + ((lm % 2) * 8 + lr) * bytes_per_row + (lm / 2) * 16;
    const unsigned krow = static_cast<unsigned>(__cvta_generic_to_shared(Kt)) + lr * bytes_per_row + (lm % 2) * 16;
#pragma unroll
    for (int j = 0; j < k_keys / 8; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
#pragma unroll
    for (int kb = 0; kb < HD / 16; ++kb) {
      uint32_t qa[4];
      ldmatrix_x4(qa, qrow + kb * 32);
#pragma unroll
      for (int j = 0; j < k_keys / 8; ++j) {
        uint32_t b[2];
        ldmatrix_x2(b, krow + j * 8 * bytes_per_row + kb * 32);
        mma(s[j], qa, b[0], b[1]);
      }
    }
  }
};

/// QS false: Q in registers, one block per SM; QS true: Q in shared memory, <= 128 registers so
/// two blocks of 8 warps share an SM. OneBarrier false: two __syncthreads per key tile (stage
/// the next tile, wait, barrier; barrier at the end); true: one (wait, barrier, stage the next
/// tile into the buffer the barrier released). baseline = <false, false>, one_barrier =
/// <false, true>, two_blocks = <true, true>.
template <int HD, bool QS, bool OneBarrier>
__global__ void __launch_bounds__(256, QS ? 2 : 1) flash_attention_prefill_kernel(const float* __restrict__ q, int ldq,
                                                                         const bf16* __restrict__ kc, const bf16* __restrict__ vc,
                                                                         float* __restrict__ out, int ldo, int n, int pos0,
                                                                         int n_kv_heads, float scale_log2) {
  using L = Layout<HD>;
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* const Ks = reinterpret_cast<bf16*>(smem);  // [buffer][key][ld]
  bf16* const Vs = Ks + 2 * L::tile;
  const int G = blockDim.x / 32, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t4 = lane % 4;  // mma fragment coordinates
  const int kvh = blockIdx.y, h = kvh * G + warp, kv_dim = n_kv_heads * HD;
  // Heaviest tiles (most keys) first: the causal work grows with the query index.
  const int q0 = (gridDim.x - 1 - blockIdx.x) * k_rows;
  const int last_key = pos0 + (q0 + k_rows - 1 < n ? q0 + k_rows - 1 : n - 1);
  const int tiles = last_key / k_keys + 1;

  auto stage = [&](int t) {  // K and V rows of tile t into buffer t % 2; rows past last_key zero
    bf16* const kd = Ks + (t & 1) * L::tile;
    bf16* const vd = Vs + (t & 1) * L::tile;
    constexpr int chunks = HD / 8;  // 16-byte pieces per row
    for (int e = threadIdx.x; e < k_keys * chunks; e += blockDim.x) {
      const int row = e / chunks, c8 = e % chunks, key = t * k_keys + row;
      const size_t at = static_cast<size_t>(key <= last_key ? key : 0) * kv_dim + static_cast<size_t>(kvh) * HD + c8 * 8;
      cp_async16(kd + row * L::ld + c8 * 8, kc + at, key <= last_key);
      cp_async16(vd + row * L::ld + c8 * 8, vc + at, key <= last_key);
    }
    cp_async_commit();
  };
  stage(0);

  // Q in bf16: fragments in registers (baseline) or the warp's rows in shared memory (two_blocks).
  QTile<HD, QS> qt;
  qt.load(q, ldq, q0, n, h, lane, Vs + 2 * L::tile + warp * k_rows * L::ld);
  float o[HD / 8][4];
#pragma unroll
  for (int f = 0; f < HD / 8; ++f) o[f][0] = o[f][1] = o[f][2] = o[f][3] = 0.f;
  // Rows g and g + 8; a row past the chunk computes as the chunk's first query (never written).
  SoftmaxRows rows;
  rows.qpos0 = pos0 + (q0 + g < n ? q0 + g : 0);
  rows.qpos1 = pos0 + (q0 + g + 8 < n ? q0 + g + 8 : 0);
  const int first_pos = pos0 + q0;  // the block's lowest query position: tiles ending at or before it need no mask
  // ldmatrix lane roles: matrix l / 8, row l % 8 of it.
  const int lm = lane / 8, lr = lane % 8;

  for (int t = 0; t < tiles; ++t) {
    if constexpr (OneBarrier) {
      cp_async_wait<0>();  // tile t, the only group in flight, has landed (this thread's part)
      // Every thread's part of tile t is visible, and every warp is done with tile t − 1, whose
      // buffer tile t + 1 takes: staged now, it lands while tile t is used.
      __syncthreads();
      if (t + 1 < tiles) stage(t + 1);
    } else {
      if (t + 1 < tiles) {
        stage(t + 1);  // lands while this tile is used (its buffer was released at the end of t − 1)
        cp_async_wait<1>();
      } else {
        cp_async_wait<0>();
      }
      __syncthreads();  // tile t is in its buffer for every thread
    }
    const bf16* const Kt = Ks + (t & 1) * L::tile;
    const bf16* const Vt = Vs + (t & 1) * L::tile;
    const int kb0 = t * k_keys;

    float s[k_keys / 8][4];  // S = Q · Kᵀ (16 × 64)
    qt.scores(s, Kt, lane);
    const bool masked = kb0 + k_keys - 1 > first_pos;
    uint32_t p[k_keys / 16][4];  // A fragments of P (bf16): key block kk = key groups 2kk, 2kk + 1
    float c0, c1;                // rescale factors of rows g and g + 8
    rows.tile(s, kb0, masked, t4, scale_log2, p, c0, c1);
    // O = O · corr + P · V over head_dim / 8 column groups (n) × 4 key blocks of 16 (k); one
    // ldmatrix.x4.trans gives the B fragments of two column groups (matrices: keys +0, +8 of
    // dims f·8, then of dims f·8 + 8).
#pragma unroll
    for (int f = 0; f < HD / 8; ++f) {
      o[f][0] *= c0;
      o[f][1] *= c0;
      o[f][2] *= c1;
      o[f][3] *= c1;
    }
#pragma unroll
    for (int kk = 0; kk < k_keys / 16; ++kk)
#pragma unroll
      for (int f = 0; f < HD / 8; f += 2) {
        uint32_t b[4];
        ldmatrix_x4_trans(b, Vt + (kk * 16 + (lm % 2) * 8 + lr) * L::ld + f * 8 + (lm / 2) * 8);
        mma(o[f], p[kk], b[0], b[1]);
        mma(o[f + 1], p[kk], b[2], b[3]);
      }
    if constexpr (!OneBarrier) __syncthreads();  // every warp is done with this buffer before tile t + 2 is staged into it
  }
  // out = O / l: this thread holds columns f·8 + 2·t4 + {0, 1} of rows g and g + 8.
  const float inv0 = 1.f / rows.l0, inv1 = 1.f / rows.l1;
#pragma unroll
  for (int f = 0; f < HD / 8; ++f) {
    const size_t col = static_cast<size_t>(h) * HD + f * 8 + t4 * 2;
    if (q0 + g < n)
      *reinterpret_cast<float2*>(out + static_cast<size_t>(q0 + g) * ldo + col) = make_float2(o[f][0] * inv0, o[f][1] * inv0);
    if (q0 + g + 8 < n)
      *reinterpret_cast<float2*>(out + static_cast<size_t>(q0 + g + 8) * ldo + col) = make_float2(o[f][2] * inv1, o[f][3] * inv1);
  }
}

constexpr int k_wide_rows = 32;  // queries per warp in wide_rows: two m16 tiles
constexpr int k_half = 32;       // keys per online-softmax step in wide_rows (half a tile)

/// wide_rows: one block per (32 queries, KV head), warp w = query head kv_head·G + w owning all
/// 32 rows as two m16 tiles (mt = 0: rows 0..15, mt = 1: rows 16..31), so each K fragment of S
/// and each V fragment of P·V read from shared memory feeds two mma (one per m tile). The warp's
/// Q rows (bf16) sit in shared memory after the K/V buffers (A fragments by ldmatrix.x4 per k
/// step and m tile); K/V tiles of 64 keys, double-buffered, one __syncthreads per tile (as
/// one_barrier), each tile taken in two online-softmax steps of 32 keys. Per thread O is 128
/// and S 32 fp32 registers: one block (8 warps) per SM.
/// wide_split: the same with `splits` = 2 blocks per (32 queries, KV head), each taking
/// blockDim.x / 32 = G / 2 of the group's heads (blockIdx.y = kv_head · splits + part), so two
/// blocks of 4 warps share an SM and one's barrier does not stall the other.
template <int HD>
__global__ void __launch_bounds__(256, 1) flash_attention_wide_kernel(const float* __restrict__ q, int ldq, const bf16* __restrict__ kc,
                                                                      const bf16* __restrict__ vc, float* __restrict__ out, int ldo, int n,
                                                                      int pos0, int n_kv_heads, int splits, float scale_log2) {
  using L = Layout<HD>;
  constexpr int bytes_per_row = L::ld * 2;
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* const Ks = reinterpret_cast<bf16*>(smem);  // [buffer][key][ld]
  bf16* const Vs = Ks + 2 * L::tile;
  const int heads = blockDim.x / 32, warp = threadIdx.x / 32, lane = threadIdx.x % 32;  // heads of this block
  const int g = lane / 4, t4 = lane % 4;    // mma fragment coordinates
  const int lm = lane / 8, lr = lane % 8;  // ldmatrix lane roles: matrix l / 8, row l % 8 of it
  const int kvh = blockIdx.y / splits, part = blockIdx.y % splits, kv_dim = n_kv_heads * HD;
  const int h = (kvh * splits + part) * heads + warp;  // = kvh · G + part · heads + warp, G = splits · heads
  const int q0 = (gridDim.x - 1 - blockIdx.x) * k_wide_rows;  // heaviest tiles first
  const int last_key = pos0 + (q0 + k_wide_rows - 1 < n ? q0 + k_wide_rows - 1 : n - 1);
  const int tiles = last_key / k_keys + 1;

  auto stage = [&](int t) {  // K and V rows of tile t into buffer t % 2; rows past last_key zero
    bf16* const kd = Ks + (t & 1) * L::tile;
    bf16* const vd = Vs + (t & 1) * L::tile;
    constexpr int chunks = HD / 8;  // 16-byte pieces per row
    for (int e = threadIdx.x; e < k_keys * chunks; e += blockDim.x) {
      const int row = e / chunks, c8 = e % chunks, key = t * k_keys + row;
      const size_t at = static_cast<size_t>(key <= last_key ? key : 0) * kv_dim + static_cast<size_t>(kvh) * HD + c8 * 8;
      cp_async16(kd + row * L::ld + c8 * 8, kc + at, key <= last_key);
      cp_async16(vd + row * L::ld + c8 * 8, vc + at, key <= last_key);
    }
    cp_async_commit();
  };
  stage(0);

  // The warp's 32 Q rows in bf16 (rows past the chunk zero), written and read by this warp only.
  bf16* const qs = Vs + 2 * L::tile + warp * k_wide_rows * L::ld;
  constexpr int pairs = HD / 2;  // float2 per row
  for (int e = lane; e < k_wide_rows * pairs; e += 32) {
    const int r = e / pairs, c = (e % pairs) * 2;
    float2 x = make_float2(0.f, 0.f);
    if (q0 + r < n) x = *reinterpret_cast<const float2*>(q + static_cast<size_t>(q0 + r) * ldq + static_cast<size_t>(h) * HD + c);
    *reinterpret_cast<uint32_t*>(qs + r * L::ld + c) = pack(x.x, x.y);
  }
  __syncwarp();
  // A fragment of m tile 0, k step 0 (matrices: rows +0 / +8 × dims +0 / +8 = a0..a3); m tile 1
  // is 16 rows further, k step kb 32 bytes further.
  const unsigned qrow = static_cast<unsigned>(__cvta_generic_to_shared(qs)) + ((lm % 2) * 8 + lr) * bytes_per_row + (lm / 2) * 16;

  float o[2][HD / 8][4];
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int f = 0; f < HD / 8; ++f) o[mt][f][0] = o[mt][f][1] = o[mt][f][2] = o[mt][f][3] = 0.f;
  // Rows mt·16 + g and mt·16 + g + 8; a row past the chunk computes as the chunk's first query.
  SoftmaxRows rows[2];
#pragma unroll
  for (int mt = 0; mt < 2; ++mt) {
    const int r0 = q0 + mt * 16 + g, r1 = r0 + 8;
    rows[mt].qpos0 = pos0 + (r0 < n ? r0 : 0);
    rows[mt].qpos1 = pos0 + (r1 < n ? r1 : 0);
  }
  const int first_pos = pos0 + q0;  // the block's lowest query position: tiles ending at or before it need no mask

  for (int t = 0; t < tiles; ++t) {
    cp_async_wait<0>();  // tile t, the only group in flight, has landed (this thread's part)
    // Every thread's part of tile t is visible, and every warp is done with tile t − 1, whose
    // buffer tile t + 1 takes: staged now, it lands while tile t is used.
    __syncthreads();
    if (t + 1 < tiles) stage(t + 1);
    const bf16* const Vt = Vs + (t & 1) * L::tile;
    // K fragment (B of S) of key group 0, k step 0 by ldmatrix.x2: matrices dims +0 / +8 of 8 keys.
    const unsigned krow = static_cast<unsigned>(__cvta_generic_to_shared(Ks + (t & 1) * L::tile)) + lr * bytes_per_row + (lm % 2) * 16;
    const int kb0 = t * k_keys;

    // The tile in two halves of k_half keys, each a full online-softmax step (S 32 × 32 is 32
    // registers per thread; 32 × 64 would not fit beside O).
#pragma unroll
    for (int kh = 0; kh < k_keys; kh += k_half) {
      if (kb0 + kh > last_key) break;  // block-uniform: no row reaches this half
      // S = Q · Kᵀ (32 × 32): per k step the A fragments of both m tiles, then per key group one
      // K fragment feeding both; each s[mt][j] adds its k steps in ascending order.
      float s[2][k_half / 8][4];
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int j = 0; j < k_half / 8; ++j) s[mt][j][0] = s[mt][j][1] = s[mt][j][2] = s[mt][j][3] = 0.f;
#pragma unroll
      for (int kb = 0; kb < HD / 16; ++kb) {
        uint32_t qa[4], qc[4];
        ldmatrix_x4(qa, qrow + kb * 32);
        ldmatrix_x4(qc, qrow + 16 * bytes_per_row + kb * 32);
#pragma unroll
        for (int j = 0; j < k_half / 8; ++j) {
          uint32_t b[2];
          ldmatrix_x2(b, krow + (kh + j * 8) * bytes_per_row + kb * 32);
          mma(s[0][j], qa, b[0], b[1]);
          mma(s[1][j], qc, b[0], b[1]);
        }
      }
      const bool masked = kb0 + kh + k_half - 1 > first_pos;
      uint32_t p[2][k_half / 16][4];  // A fragments of P per m tile
      float c[2][2];                  // rescale factors of rows g and g + 8 per m tile
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) rows[mt].tile(s[mt], kb0 + kh, masked, t4, scale_log2, p[mt], c[mt][0], c[mt][1]);
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int f = 0; f < HD / 8; ++f) {
          o[mt][f][0] *= c[mt][0];
          o[mt][f][1] *= c[mt][0];
          o[mt][f][2] *= c[mt][1];
          o[mt][f][3] *= c[mt][1];
        }
      // O += P · V: one ldmatrix.x4.trans (keys +0, +8 of dims f·8, then of dims f·8 + 8) gives
      // the B fragments of two column groups, used by both m tiles.
#pragma unroll
      for (int kk = 0; kk < k_half / 16; ++kk)
#pragma unroll
        for (int f = 0; f < HD / 8; f += 2) {
          uint32_t b[4];
          ldmatrix_x4_trans(b, Vt + (kh + kk * 16 + (lm % 2) * 8 + lr) * L::ld + f * 8 + (lm / 2) * 8);
#pragma unroll
          for (int mt = 0; mt < 2; ++mt) {
            mma(o[mt][f], p[mt][kk], b[0], b[1]);
            mma(o[mt][f + 1], p[mt][kk], b[2], b[3]);
          }
        }
    }
  }
  // out = O / l: this thread holds columns f·8 + 2·t4 + {0, 1} of rows mt·16 + g and mt·16 + g + 8.
#pragma unroll
  for (int mt = 0; mt < 2; ++mt) {
    const float inv0 = 1.f / rows[mt].l0, inv1 = 1.f / rows[mt].l1;
    const int r0 = q0 + mt * 16 + g, r1 = r0 + 8;
#pragma unroll
    for (int f = 0; f < HD / 8; ++f) {
      const size_t col = static_cast<size_t>(h) * HD + f * 8 + t4 * 2;
      if (r0 < n)
        *reinterpret_cast<float2*>(out + static_cast<size_t>(r0) * ldo + col) = make_float2(o[mt][f][0] * inv0, o[mt][f][1] * inv0);
      if (r1 < n)
        *reinterpret_cast<float2*>(out + static_cast<size_t>(r1) * ldo + col) = make_float2(o[mt][f][2] * inv1, o[mt][f][3] * inv1);
    }
  }
}

/// split: wide_split (two blocks per KV head) where the group is even and the grid's y (n_kv_heads · 2)
/// stays <= 65535; otherwise wide_rows.
template <int HD>
void launch_wide(const float* q, int ldq, const bf16* kc, const bf16* vc, float* out, int ldo, int n, int pos0, int n_kv_heads,
                 int group, bool split, cudaStream_t stream) {
  const int splits = split && group % 2 == 0 && n_kv_heads <= 65535 / 2 ? 2 : 1, heads = group / splits;
  const std::size_t smem = Layout<HD>::smem + static_cast<std::size_t>(heads * k_wide_rows * Layout<HD>::ld) * 2;
  CUDA_CHECK(cudaFuncSetAttribute(flash_attention_wide_kernel<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  CUDA_CHECK(cudaFuncSetAttribute(flash_attention_wide_kernel<HD>, cudaFuncAttributePreferredSharedMemoryCarveout,
                                  cudaSharedmemCarveoutMaxShared));
  const dim3 grid(static_cast<unsigned>((n + k_wide_rows - 1) / k_wide_rows), static_cast<unsigned>(n_kv_heads * splits));
  const float scale_log2 = static_cast<float>(1.0 / std::sqrt(static_cast<double>(HD)) * 1.4426950408889634);  // log2 e
  flash_attention_wide_kernel<HD><<<grid, 32 * heads, smem, stream>>>(q, ldq, kc, vc, out, ldo, n, pos0, n_kv_heads, splits,
                                                                      scale_log2);
  detail::check_launch();
}

template <int HD, bool QS, bool OneBarrier>
void launch_hd(const float* q, int ldq, const bf16* kc, const bf16* vc, float* out, int ldo, int n, int pos0, int n_kv_heads,
               int group, cudaStream_t stream) {
  const std::size_t smem = QS ? Layout<HD>::smem_q_shared(group) : Layout<HD>::smem;
  // Per launch (cheap): the attribute is per device, and a backend may run on any device.
  CUDA_CHECK(cudaFuncSetAttribute(flash_attention_prefill_kernel<HD, QS, OneBarrier>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  static_cast<int>(smem)));
  // two_blocks: ask for the largest shared-memory carveout so that two blocks fit on an SM.
  if constexpr (QS)
    CUDA_CHECK(cudaFuncSetAttribute(flash_attention_prefill_kernel<HD, QS, OneBarrier>, cudaFuncAttributePreferredSharedMemoryCarveout,
                                    cudaSharedmemCarveoutMaxShared));
  const dim3 grid(static_cast<unsigned>((n + k_rows - 1) / k_rows), static_cast<unsigned>(n_kv_heads));
  const float scale_log2 = static_cast<float>(1.0 / std::sqrt(static_cast<double>(HD)) * 1.4426950408889634);  // log2 e
  flash_attention_prefill_kernel<HD, QS, OneBarrier><<<grid, 32 * group, smem, stream>>>(q, ldq, kc, vc, out, ldo, n, pos0, n_kv_heads,
                                                                             scale_log2);
  detail::check_launch();
}

template <int HD>
void launch_variant(FlashVariant variant, const float* q, int ldq, const bf16* kc, const bf16* vc, float* out, int ldo, int n,
                    int pos0, int n_kv_heads, int group, cudaStream_t stream) {
  switch (variant) {
    case FlashVariant::one_barrier: launch_hd<HD, false, true>(q, ldq, kc, vc, out, ldo, n, pos0, n_kv_heads, group, stream); break;
    case FlashVariant::two_blocks: launch_hd<HD, true, true>(q, ldq, kc, vc, out, ldo, n, pos0, n_kv_heads, group, stream); break;
    case FlashVariant::wide_rows: launch_wide<HD>(q, ldq, kc, vc, out, ldo, n, pos0, n_kv_heads, group, false, stream); break;
    case FlashVariant::wide_split: launch_wide<HD>(q, ldq, kc, vc, out, ldo, n, pos0, n_kv_heads, group, true, stream); break;
    default: launch_hd<HD, false, false>(q, ldq, kc, vc, out, ldo, n, pos0, n_kv_heads, group, stream); break;
  }
}

/// The process-wide selection: -1 until first read, then a FlashVariant value.
std::atomic<int>& selected_variant() {
  static std::atomic<int> v{-1};
  return v;
}

FlashVariant variant_from_environment() {
  const char* text = std::getenv("SERVEDECK_FLASH_VARIANT");
  if (text == nullptr || *text == '\0') return FlashVariant::baseline;
  FlashVariant v = FlashVariant::baseline;
  if (parse_flash_variant(text, v)) return v;
  std::fprintf(stderr,
               "servedeck: SERVEDECK_FLASH_VARIANT is '%s', expected baseline, one_barrier, two_blocks, wide_rows or wide_split; "
               "using baseline\n",
               text);
  return FlashVariant::baseline;
}

}  // namespace

const char* to_string(FlashVariant variant) {
  switch (variant) {
    case FlashVariant::baseline: return "baseline";
    case FlashVariant::one_barrier: return "one_barrier";
    case FlashVariant::two_blocks: return "two_blocks";
    case FlashVariant::wide_rows: return "wide_rows";
    case FlashVariant::wide_split: return "wide_split";
  }
  return "unknown";
}

bool parse_flash_variant(std::string_view text, FlashVariant& out) {
  for (const FlashVariant v : k_flash_variants)
    if (text == to_string(v)) {
      out = v;
      return true;
    }
  return false;
}

FlashVariant flash_variant() {
  int v = selected_variant().load(std::memory_order_relaxed);
  if (v < 0) {
    int expected = -1;
    const int from_env = static_cast<int>(variant_from_environment());
    // A concurrent set_flash_variant wins over the environment.
    v = selected_variant().compare_exchange_strong(expected, from_env) ? from_env : expected;
  }
  return static_cast<FlashVariant>(v);
}

void set_flash_variant(FlashVariant variant) { selected_variant().store(static_cast<int>(variant)); }

bool flash_attention_supported(int n_heads, int n_kv_heads, int head_dim) {
  return (head_dim == 32 || head_dim == 64 || head_dim == 128) && n_kv_heads > 0 && n_heads % n_kv_heads == 0 &&
         n_heads / n_kv_heads >= 1 && n_heads / n_kv_heads <= 8;
}

void launch_flash_attention_prefill(const float* q, int ldq, const bf16* k, const bf16* v, float* out, int ldo, int n, int pos0,
                                    int n_heads, int n_kv_heads, int head_dim, cudaStream_t stream) {
  launch_flash_attention_prefill(q, ldq, k, v, out, ldo, n, pos0, n_heads, n_kv_heads, head_dim, stream, flash_variant());
}

void launch_flash_attention_prefill(const float* q, int ldq, const bf16* k, const bf16* v, float* out, int ldo, int n, int pos0,
                                    int n_heads, int n_kv_heads, int head_dim, cudaStream_t stream, FlashVariant variant) {
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
  const auto mod = [](const void* p, unsigned m) { return std::to_string(reinterpret_cast<std::uintptr_t>(p) % m); };
  require(detail::aligned16(k) && detail::aligned16(v), "launch_flash_attention_prefill",
          "k and v must be 16-byte aligned (cp.async), got addresses % 16 = " + mod(k, 16) + " and " + mod(v, 16));
  require(reinterpret_cast<std::uintptr_t>(q) % 8 == 0 && reinterpret_cast<std::uintptr_t>(out) % 8 == 0,
          "launch_flash_attention_prefill",
          "q and out must be 8-byte aligned (read and written as float2), got addresses % 8 = " + mod(q, 8) + " and " + mod(out, 8));
  const int group = n_heads / n_kv_heads;
  switch (head_dim) {
    case 32: launch_variant<32>(variant, q, ldq, k, v, out, ldo, n, pos0, n_kv_heads, group, stream); break;
    case 64: launch_variant<64>(variant, q, ldq, k, v, out, ldo, n, pos0, n_kv_heads, group, stream); break;
    default: launch_variant<128>(variant, q, ldq, k, v, out, ldo, n, pos0, n_kv_heads, group, stream); break;
  }
}

}  // namespace servedeck::worker::cuda
