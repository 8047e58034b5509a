// Flash-style causal prefill attention (see flash_attention.cuh) on bf16 tensor cores through
// mma.sync m16n8k16 and ldmatrix (PTX ISA, "Matrix fragments for mma.m16n8k16 with floating
// point type", "ldmatrix"; the wrappers and the softmax step are in flash_mma.cuh); the loop
// follows FlashAttention-2 (Dao, 2023): key/value tiles stream through shared memory, softmax is
// online.
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
// mma and mma_two_blocks (FlashKernel, flash_attention.cuh) share flash_attention_prefill_kernel:
// mma keeps Q in registers and takes two barriers per tile; mma_two_blocks keeps Q in the block's
// shared memory, read by ldmatrix per k step, so that a thread fits in 128 registers and two
// blocks share an SM, and takes one barrier per tile. wgmma (flash_wgmma.cuh) runs the same loop
// on Hopper warpgroup MMAs (sm_90a only). flash_kernel_for picks by device and shape.
#include "worker/cuda/flash_attention.cuh"

#include <atomic>
#include <cmath>
#include <cstdint>
#include <string>

#include "worker/cuda/flash_mma.cuh"
#include "worker/cuda/flash_wgmma.cuh"
#include "worker/cuda/fused_launch.cuh"
#include "worker/cuda/launch_check.cuh"

namespace servedeck::worker::cuda {

namespace {

using namespace flash;  // bf16, cp.async, ldmatrix, mma, SoftmaxRows

constexpr int k_rows = 16;  // queries per warp (mma M)
constexpr int k_keys = 64;  // keys per tile

template <int HD>
struct Layout {
  static constexpr int ld = HD + 8;  // bf16 row stride: the 8 rows of an ldmatrix fall in distinct banks
  static constexpr int tile = k_keys * ld;  // bf16 elements of one K or V tile
  static constexpr std::size_t smem = static_cast<std::size_t>(2 * 2 * tile) * 2;  // 2 buffers × (K, V)
  /// mma_two_blocks: K/V buffers, then Q of the group's `group` heads (16 rows of ld each, bf16).
  static std::size_t smem_q_shared(int group) { return smem + static_cast<std::size_t>(group * k_rows * ld) * 2; }
};

/// mma: the warp's Q fragments (rows g and g + 8 of its 16) in bf16 registers, read once
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

/// mma_two_blocks: the warp's 16 Q rows in shared memory (bf16, row stride Layout::ld), written once
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
  /// B fragment) feeding one mma; x2 rather than mma's x4 over two k steps keeps 6
  /// fewer registers live (128 without spills). Each s[j] still accumulates its k steps in
  /// ascending order, as mma does.
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

/// TwoBlocks false (mma): Q in registers, one block per SM, two __syncthreads per key tile
/// (stage the next tile, wait, barrier; barrier at the end). TwoBlocks true (two_blocks): Q in
/// shared memory, <= 128 registers so two blocks of 8 warps share an SM, one __syncthreads per
/// key tile (wait, barrier, stage the next tile into the buffer the barrier released).
template <int HD, bool TwoBlocks>
__global__ void __launch_bounds__(256, TwoBlocks ? 2 : 1) flash_attention_prefill_kernel(const float* __restrict__ q, int ldq,
                                                                         const bf16* __restrict__ kc, const bf16* __restrict__ vc,
                                                                         float* __restrict__ out, int ldo, int n, int pos0,
                                                                         int n_kv_heads, int subgroups, float scale_log2) {
  using L = Layout<HD>;
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* const Ks = reinterpret_cast<bf16*>(smem);  // [buffer][key][ld]
  bf16* const Vs = Ks + 2 * L::tile;
  const int G = blockDim.x / 32, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t4 = lane % 4;  // mma fragment coordinates
  // Block row y: KV head y / subgroups, query heads y·G .. y·G + G − 1 (G = the block's heads).
  const int kvh = blockIdx.y / subgroups, h = blockIdx.y * G + warp, kv_dim = n_kv_heads * HD;
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

  // Q in bf16: fragments in registers (mma) or the warp's rows in shared memory (mma_two_blocks).
  QTile<HD, TwoBlocks> qt;
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
    if constexpr (TwoBlocks) {
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
    rescale_rows(o, c0, c1);
#pragma unroll
    for (int kk = 0; kk < k_keys / 16; ++kk)
#pragma unroll
      for (int f = 0; f < HD / 8; f += 2) {
        uint32_t b[4];
        ldmatrix_x4_trans(b, Vt + (kk * 16 + (lm % 2) * 8 + lr) * L::ld + f * 8 + (lm / 2) * 8);
        mma(o[f], p[kk], b[0], b[1]);
        mma(o[f + 1], p[kk], b[2], b[3]);
      }
    if constexpr (!TwoBlocks) __syncthreads();  // every warp is done with this buffer before tile t + 2 is staged into it
  }
  store_rows(out, ldo, o, rows.l0, rows.l1, q0, n, static_cast<size_t>(h) * HD, g, t4);
}

template <int HD, bool TwoBlocks>
std::size_t mma_smem(int group) {
  return TwoBlocks ? Layout<HD>::smem_q_shared(group) : Layout<HD>::smem;
}

/// Query heads one block of `kernel` serves for a GQA group of `group` (FlashKernel,
/// flash_attention.cuh): wgmma 8 or 4 (group a multiple of 4), the mma kernels the group itself up to 8, above
/// it the group's largest divisor <= 8 (12 → 6, 16 → 8). The group's heads are split over
/// group / block_heads blocks that each stream the KV head's tiles.
int block_heads(FlashKernel kernel, int group) {
  if (kernel == FlashKernel::wgmma) return group % 8 == 0 ? 8 : 4;
  int g = group < 8 ? group : 8;
  while (group % g != 0) --g;
  return g;
}

template <int HD, bool TwoBlocks>
void launch_hd(const float* q, int ldq, const bf16* kc, const bf16* vc, float* out, int ldo, int n, int pos0, int n_kv_heads,
               int group, cudaStream_t stream) {
  const int heads = block_heads(TwoBlocks ? FlashKernel::mma_two_blocks : FlashKernel::mma, group), subgroups = group / heads;
  const std::size_t smem = mma_smem<HD, TwoBlocks>(heads);
  // Per launch (cheap): the attribute is per device, and a backend may run on any device.
  CUDA_CHECK(cudaFuncSetAttribute(flash_attention_prefill_kernel<HD, TwoBlocks>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  static_cast<int>(smem)));
  // mma_two_blocks: ask for the largest shared-memory carveout so that two blocks fit on an SM.
  if constexpr (TwoBlocks)
    CUDA_CHECK(cudaFuncSetAttribute(flash_attention_prefill_kernel<HD, TwoBlocks>, cudaFuncAttributePreferredSharedMemoryCarveout,
                                    cudaSharedmemCarveoutMaxShared));
  const dim3 grid(static_cast<unsigned>((n + k_rows - 1) / k_rows), static_cast<unsigned>(n_kv_heads * subgroups));
  const float scale_log2 = static_cast<float>(1.0 / std::sqrt(static_cast<double>(HD)) * 1.4426950408889634);  // log2 e
  flash_attention_prefill_kernel<HD, TwoBlocks><<<grid, 32 * heads, smem, stream>>>(q, ldq, kc, vc, out, ldo, n, pos0, n_kv_heads,
                                                                                   subgroups, scale_log2);
  detail::check_launch();
}

/// The wgmma kernel (flash_wgmma.cuh) for head_dim 128 and a group that is a multiple of 4
/// (blocks of 8 or 4 of its heads, block_heads).
void launch_wgmma(const float* q, int ldq, const bf16* kc, const bf16* vc, float* out, int ldo, int n, int pos0, int n_kv_heads,
                  int group, cudaStream_t stream) {
  CUDA_CHECK(cudaFuncSetAttribute(flash_wgmma_prefill_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(k_wg_smem_bytes)));
  const int heads = block_heads(FlashKernel::wgmma, group), subgroups = group / heads;
  const int bq = wg_block_queries(heads);
  const dim3 grid(static_cast<unsigned>((n + bq - 1) / bq), static_cast<unsigned>(n_kv_heads * subgroups));
  const float scale_log2 = static_cast<float>(1.0 / std::sqrt(static_cast<double>(k_wg_hd)) * 1.4426950408889634);  // log2 e
  flash_wgmma_prefill_kernel<<<grid, 32 * k_wg_warps, k_wg_smem_bytes, stream>>>(q, ldq, kc, vc, out, ldo, n, pos0, n_kv_heads, heads,
                                                                                 subgroups, scale_log2);
  detail::check_launch();
}

/// Runs flash_wgmma_probe_kernel once; -1 until then.
std::atomic<int>& wgmma_probe_result() {
  static std::atomic<int> v{-1};
  return v;
}

/// Dynamic shared memory of `kernel` for head_dim hd and group `group`.
std::size_t kernel_smem(FlashKernel kernel, int hd, int group) {
  switch (kernel) {
    case FlashKernel::wgmma: return k_wg_smem_bytes;
    case FlashKernel::mma_two_blocks: {
      const int heads = block_heads(kernel, group);
      return hd == 32 ? mma_smem<32, true>(heads) : hd == 64 ? mma_smem<64, true>(heads) : mma_smem<128, true>(heads);
    }
    case FlashKernel::mma: break;
  }
  return hd == 32 ? mma_smem<32, false>(group) : hd == 64 ? mma_smem<64, false>(group) : mma_smem<128, false>(group);
}

template <int HD>
void launch_kernel(FlashKernel kernel, const float* q, int ldq, const bf16* kc, const bf16* vc, float* out, int ldo, int n, int pos0,
                   int n_kv_heads, int group, cudaStream_t stream) {
  switch (kernel) {
    case FlashKernel::wgmma: return launch_wgmma(q, ldq, kc, vc, out, ldo, n, pos0, n_kv_heads, group, stream);
    case FlashKernel::mma_two_blocks: return launch_hd<HD, true>(q, ldq, kc, vc, out, ldo, n, pos0, n_kv_heads, group, stream);
    case FlashKernel::mma: return launch_hd<HD, false>(q, ldq, kc, vc, out, ldo, n, pos0, n_kv_heads, group, stream);
  }
}

}  // namespace

const char* to_string(FlashKernel kernel) {
  switch (kernel) {
    case FlashKernel::mma: return "mma";
    case FlashKernel::mma_two_blocks: return "mma_two_blocks";
    case FlashKernel::wgmma: return "wgmma";
  }
  return "unknown";
}

bool flash_wgmma_available() {
  int v = wgmma_probe_result().load(std::memory_order_relaxed);
  if (v >= 0) return v == 1;
  int* flag = nullptr;
  int host = 0;
  bool ok = cudaMalloc(&flag, sizeof(int)) == cudaSuccess;
  if (ok) {
    flash_wgmma_probe_kernel<<<1, 1>>>(flag);
    ok = cudaGetLastError() == cudaSuccess && cudaMemcpy(&host, flag, sizeof(int), cudaMemcpyDeviceToHost) == cudaSuccess;
  }
  if (flag != nullptr) cudaFree(flag);
  if (!ok) (void)cudaGetLastError();  // a failed probe (no kernel image for the device) reads as "not available"
  v = ok && host == 1 ? 1 : 0;
  wgmma_probe_result().store(v);
  return v == 1;
}

bool flash_attention_supported(int n_heads, int n_kv_heads, int head_dim) {
  return (head_dim == 32 || head_dim == 64 || head_dim == 128) && n_kv_heads > 0 && n_heads % n_kv_heads == 0 &&
         n_heads / n_kv_heads >= 1 && n_heads / n_kv_heads <= 16;
}

bool flash_kernel_runs(FlashKernel kernel, int n_heads, int n_kv_heads, int head_dim) {
  if (!flash_attention_supported(n_heads, n_kv_heads, head_dim)) return false;
  const int group = n_heads / n_kv_heads;
  if (kernel == FlashKernel::wgmma && !(head_dim == k_wg_hd && group % 4 == 0 && flash_wgmma_available())) return false;
  // The kernels' static shared memory is a few bytes; 1 KB is left for it.
  return kernel_smem(kernel, head_dim, group) + 1024 <= detail::smem_per_block();
}

FlashKernel flash_kernel_for(int n_heads, int n_kv_heads, int head_dim) {
  for (const FlashKernel k : {FlashKernel::wgmma, FlashKernel::mma_two_blocks})
    if (flash_kernel_runs(k, n_heads, n_kv_heads, head_dim)) return k;
  return FlashKernel::mma;
}

void launch_flash_attention_prefill(const float* q, int ldq, const bf16* k, const bf16* v, float* out, int ldo, int n, int pos0,
                                    int n_heads, int n_kv_heads, int head_dim, cudaStream_t stream) {
  launch_flash_attention_prefill(q, ldq, k, v, out, ldo, n, pos0, n_heads, n_kv_heads, head_dim, stream,
                                 flash_attention_supported(n_heads, n_kv_heads, head_dim) ? flash_kernel_for(n_heads, n_kv_heads, head_dim)
                                                                                          : FlashKernel::mma);
}

void launch_flash_attention_prefill(const float* q, int ldq, const bf16* k, const bf16* v, float* out, int ldo, int n, int pos0,
                                    int n_heads, int n_kv_heads, int head_dim, cudaStream_t stream, FlashKernel kernel) {
  using detail::require;
  require(flash_attention_supported(n_heads, n_kv_heads, head_dim), "launch_flash_attention_prefill",
          "head_dim must be 32, 64 or 128 and n_heads a multiple of n_kv_heads with n_heads / n_kv_heads in [1, 16], got head_dim " +
              std::to_string(head_dim) + ", heads " + std::to_string(n_heads) + " / " + std::to_string(n_kv_heads));
  require(n_kv_heads <= 4095, "launch_flash_attention_prefill", "n_kv_heads must be <= 4095, got " + std::to_string(n_kv_heads));
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
  require(flash_kernel_runs(kernel, n_heads, n_kv_heads, head_dim), "launch_flash_attention_prefill",
          std::string("kernel ") + to_string(kernel) + " does not run head_dim " + std::to_string(head_dim) + ", heads " +
              std::to_string(n_heads) + " / " + std::to_string(n_kv_heads) + " on this device (sm_90a code, or its shared memory)");
  const int group = n_heads / n_kv_heads;
  switch (head_dim) {
    case 32: launch_kernel<32>(kernel, q, ldq, k, v, out, ldo, n, pos0, n_kv_heads, group, stream); break;
    case 64: launch_kernel<64>(kernel, q, ldq, k, v, out, ldo, n, pos0, n_kv_heads, group, stream); break;
    default: launch_kernel<128>(kernel, q, ldq, k, v, out, ldo, n, pos0, n_kv_heads, group, stream); break;
  }
}

}  // namespace servedeck::worker::cuda
