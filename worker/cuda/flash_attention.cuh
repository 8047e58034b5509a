// Causal prefill attention on tensor cores, flash-style: each block streams key/value tiles of
// the KV cache through shared memory and keeps a running (max, sum) softmax per query row, so
// the (queries × keys) score matrix never reaches device memory (Dao et al., "FlashAttention",
// 2022, online softmax of Milakov & Gimelshein 2018).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <string_view>

namespace servedeck::worker::cuda {

/// Which kernel launch_flash_attention_prefill runs. Both keep the numerics contract of
/// launch_flash_attention_prefill below (same roundings, log2-domain online softmax of 64-key
/// steps, masking, fp32 running max/sum/output) with each S entry adding its k steps in the same
/// order, so their outputs are expected to agree bitwise (flash_attention_test.cpp allows 1e-5
/// for a different FMA contraction). Figures: H200, one layer, 32/4 heads of 128, pos0 0,
/// bench_moe_offload --breakdown-only 1 (session 7 run 3,
/// bench/moe_offload/results-2026-11-30-h200-session7.txt).
/// Variants measured slower than two_blocks and removed (speed-up over baseline at 16384 tokens):
/// one_barrier (baseline with one __syncthreads per key tile) 1.036x; wide_rows (32 query rows
/// per warp as two m16 tiles, 32-key softmax steps) 1.091x; wide_split (wide_rows over two blocks
/// of group / 2 warps per KV head) 1.123x.
enum class FlashVariant {
  /// The reference kernel. One block per (16 queries, KV head), one warp per query head of the
  /// group, each warp's Q fragments in registers (32 at head_dim 128), O 64 and S 32 fp32
  /// registers per thread; K/V tiles of 64 keys double-buffered by cp.async:
  /// 2·2·64·(hd + 8)·2 B = 69.6 KB of shared memory at head_dim 128; two __syncthreads per key
  /// tile; __launch_bounds__(256, 1): one block (8 warps) per SM. Registers (ptxas, sm_90): 210
  /// at head_dim 128, 158 at 64, 102 at 32, no spills. Measured: 512 tokens 0.028 ms (75.6
  /// TFLOP/s), 4096 tokens 0.587 ms (234.2 TFLOP/s), 16384 tokens 8.669 ms (253.7 TFLOP/s).
  baseline,
  /// The default where wgmma_wide cannot run (a build without sm_90a code, other shapes). The
  /// baseline's blocks, tiles and loop, but the block's Q (group · 16 rows × hd,
  /// bf16, row stride hd + 8) is written once into shared memory after the K/V buffers and each
  /// warp reads its A fragment by one ldmatrix.x4 per k step (1 per 8 mma of S = Q·Kᵀ), so no
  /// registers hold Q: __launch_bounds__(256, 2) caps a thread at 128 registers and two blocks
  /// (16 warps) share an SM, one block's softmax overlapping the other's tensor-core work.
  /// Shared memory 69.6 KB + group·16·(hd + 8)·2 B = 102 KB per block at group 8, head_dim 128
  /// (two blocks: 204 KB of the 227 KB an H100/H200 SM offers); the largest carveout is asked
  /// for. S's K fragments come by ldmatrix.x2 (one per mma). One __syncthreads per key tile:
  /// wait for tile t, barrier, stage tile t + 1 into the buffer of t − 1. Registers (ptxas,
  /// sm_90): 128 at head_dim 128, 120 at 64, 89 at 32, no spills. Measured: 512 tokens 0.030 ms
  /// (72.0 TFLOP/s, 0.952x the baseline), 4096 tokens 0.513 ms (268.1 TFLOP/s, 1.144x), 16384
  /// tokens 7.275 ms (302.3 TFLOP/s, 1.192x); the whole 16k-token resident prefill 0.680 s
  /// against 0.745 s with the baseline (session 7 run 2; transformers: 0.729 s).
  two_blocks,
  /// Hopper warpgroup MMA (flash_wgmma.cuh): the baseline's blocks (16 queries × the group's
  /// heads; warp w = head kv_head·G + w) as G / 4 warpgroups whose M = 64 tile is 4 heads × 16
  /// queries, so every row's causal mask and softmax state are the baseline's. Per 64-key tile:
  /// S by 8 wgmma.mma_async m64n64k16 (Q as bf16 register A fragments, K from a 128-byte
  /// swizzled K-major shared tile), the baseline's softmax step on the accumulators, O += P·V by
  /// 4 wgmma m64n128k16 (P from registers, V as an MN-major swizzled tile, transposed). Same
  /// numerics contract; S and O add their k steps in the tensor core's own order (on the H200
  /// the outputs matched the baseline's bitwise on every test shape, session 7 run 7; the test
  /// allows 1e-5). Runs only for head_dim 128 with n_heads / n_kv_heads 4 or 8 and only when
  /// flash_attention.cu was compiled for sm_90a (flash_wgmma_available(); the default
  /// CMAKE_CUDA_ARCHITECTURES is 90a); any other shape or build runs two_blocks instead. Shared
  /// memory 2·2·16 KB + 1 KB = 65 KB, __launch_bounds__(256, 1), 162 registers. Measured (H200,
  /// session 7 run 8, sm_90a build): 512 tokens 0.024 ms (90.5 TFLOP/s, 1.163x the baseline),
  /// 4096 tokens 0.474 ms (290.1, 1.240x), 16384 tokens 6.915 ms (318.0, 1.254x).
  wgmma,
  /// wgmma with 16 warps (four warpgroups) per block: 16·16 / G queries (32 at group 8) × the
  /// group's heads, so each K/V tile in shared memory serves 256 query rows (half the L2 traffic
  /// of wgmma); Q is written once into shared memory in the K tile's swizzled layout and S runs
  /// as shared × shared wgmma (no Q registers), so a thread fits in 128 registers. Shared memory
  /// 65 KB + 64 KB = 129 KB, __launch_bounds__(512, 1), 128 registers. Same shapes, fallback and
  /// numerics as wgmma. The default. Measured (H200, session 7 run 8, sm_90a build): 512 tokens
  /// 0.035 ms (60.9 TFLOP/s, 0.782x the baseline), 4096 tokens 0.395 ms (347.6, 1.485x), 16384
  /// tokens 5.630 ms (390.6, 1.540x); the whole resident prefill 0.057 / 0.139 / 0.564 s at 512 /
  /// 4096 / 16384 tokens against 0.060 / 0.146 / 0.653 s with two_blocks (runs 8 and 7).
  wgmma_wide,
};

/// What flash_variant() returns when neither set_flash_variant nor SERVEDECK_FLASH_VARIANT chose.
inline constexpr FlashVariant k_default_flash_variant = FlashVariant::wgmma_wide;

/// Every variant, in declaration order (tests and benches loop over it; baseline first).
inline constexpr FlashVariant k_flash_variants[] = {FlashVariant::baseline, FlashVariant::two_blocks, FlashVariant::wgmma,
                                                    FlashVariant::wgmma_wide};

/// "baseline", "two_blocks", "wgmma" or "wgmma_wide" (the values of SERVEDECK_FLASH_VARIANT).
const char* to_string(FlashVariant variant);

/// Sets out and returns true when text is a variant's to_string; false (out untouched) otherwise.
bool parse_flash_variant(std::string_view text, FlashVariant& out);

/// The variant the launcher without a variant argument runs: set_flash_variant's last value, or
/// else the environment variable SERVEDECK_FLASH_VARIANT read once at the first call ("baseline",
/// "two_blocks", "wgmma" or "wgmma_wide"); unset or empty means k_default_flash_variant (wgmma_wide), and an unknown
/// value means the default after one line on stderr naming the value read and the values
/// accepted. Thread-safe.
FlashVariant flash_variant();

/// Selects the variant for the whole process (overrides SERVEDECK_FLASH_VARIANT). Thread-safe.
void set_flash_variant(FlashVariant variant);

/// True when the wgmma variants' kernels are in this build for the current device: flash_attention.cu
/// compiled for sm_90a (its device code has __CUDA_ARCH_FEAT_SM90_ALL) and that code is what the
/// runtime loads. Probed once per process by a one-thread kernel and a synchronous copy (not
/// callable inside a stream capture the first time); a failed probe reads as false.
bool flash_wgmma_available();

/// True when launch_flash_attention_prefill handles this shape: head_dim 32, 64 or 128 and
/// n_heads a multiple of n_kv_heads with n_heads / n_kv_heads <= 8 (one warp per query head of a group).
bool flash_attention_supported(int n_heads, int n_kv_heads, int head_dim);

/// out[i, h·hd : (h+1)·hd] = softmax_j(q_i,h · k_j / sqrt(hd)) · v_j over keys j in [0, pos0 + i],
/// for chunk rows i < n (query i sits at position pos0 + i) and query heads h < n_heads; KV head
/// of h = h / (n_heads / n_kv_heads) (GQA).
///   q: (n, ldq) fp32, head h of row i at q + i·ldq + h·hd (already q-normed and rotated);
///   k, v: (>= pos0 + n, n_kv_heads·hd) bf16, rows [0, pos0 + n) written (the prefill path
///         rounds the layer's fp32 cache rows into a bf16 copy before the launch);
///   out: (n, ldo) fp32.
/// Numerics are those of a bf16 engine (FlashAttention-2, transformers in bf16): q is rounded to
/// bf16, S = Q·Kᵀ and O = P·V run on bf16 tensor cores (mma.sync m16n8k16) with fp32
/// accumulation, the probabilities P are bf16 (relative rounding 2^-9) and the running sum adds
/// the rounded values, so each row's weights sum to exactly what multiplies v; the running max
/// and sum and the output stay fp32. Against fp32 attention a score moves by up to ~2^-8 of
/// |q|·|k|: on a peaked softmax that moves probabilities by percent (flash_attention_test.cpp,
/// backend_test.cpp state the measured sizes); the cuBLAS path (TF32 on the fp32 cache) is the
/// closer one.
/// One block per (16 queries, KV head) with one warp per query head of the group; the kernel is
/// flash_variant()'s (see FlashVariant).
/// Throws std::invalid_argument when !flash_attention_supported, n_kv_heads > 65535, n <= 0,
/// pos0 < 0, ldq/ldo odd or shorter than n_heads · head_dim, k/v not 16-byte aligned, or
/// q/out not 8-byte aligned.
void launch_flash_attention_prefill(const float* q, int ldq, const __nv_bfloat16* k, const __nv_bfloat16* v, float* out,
                                    int ldo, int n, int pos0, int n_heads, int n_kv_heads, int head_dim, cudaStream_t stream);

/// As above with an explicit variant (ignores flash_variant()); same shapes, checks and errors.
void launch_flash_attention_prefill(const float* q, int ldq, const __nv_bfloat16* k, const __nv_bfloat16* v, float* out,
                                    int ldo, int n, int pos0, int n_heads, int n_kv_heads, int head_dim, cudaStream_t stream,
                                    FlashVariant variant);

}  // namespace servedeck::worker::cuda
