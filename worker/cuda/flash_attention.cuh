// Causal prefill attention on tensor cores, flash-style: each block streams key/value tiles of
// the KV cache through shared memory and keeps a running (max, sum) softmax per query row, so
// the (queries × keys) score matrix never reaches device memory (Dao et al., "FlashAttention",
// 2022, online softmax of Milakov & Gimelshein 2018).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <string_view>

namespace servedeck::worker::cuda {

/// Which kernel launch_flash_attention_prefill runs, for A/B comparison. Every variant keeps the
/// numerics contract of launch_flash_attention_prefill below (same roundings, log2-domain online
/// softmax, masking, fp32 running max/sum/output). baseline, one_barrier and two_blocks also take
/// the same online-softmax steps (64 keys) with each S entry adding its k steps in the same
/// order, so their outputs are expected to agree bitwise (flash_attention_test.cpp allows 1e-5
/// for a different FMA contraction); wide_rows and wide_split take steps of 32 keys, so their
/// bf16 P rounds against other running maxima and agrees with the others only within the test's
/// tolerance against the reference. Speed figures of every variant but baseline are NOT
/// measured yet (written without a GPU; bench/moe_offload/flash_bench.cpp prints every variant).
enum class FlashVariant {
  /// One block per (16 queries, KV head), one warp per query head of the group, each warp's Q
  /// fragments in registers (32 at head_dim 128), O 64 and S 32 fp32 registers per thread;
  /// K/V tiles of 64 keys double-buffered by cp.async: 2·2·64·(hd + 8)·2 B = 69.6 KB of shared
  /// memory at head_dim 128; __launch_bounds__(256, 1): one block (8 warps) per SM. Measured on
  /// an H200 (32/4 heads of 128): 4096 tokens 0.597 ms (230 TFLOP/s), 16384 tokens 8.651 ms
  /// (254 TFLOP/s).
  baseline,
  /// The baseline with one __syncthreads per key tile instead of two: wait for tile t, barrier
  /// (tile t visible to all; every warp done with tile t − 1), then stage tile t + 1 into the
  /// buffer of t − 1. Same registers and shared memory as the baseline.
  one_barrier,
  /// The baseline's blocks, tiles and loop, but the block's Q (group · 16 rows × hd, bf16,
  /// row stride hd + 8) is written once into shared memory after the K/V buffers and each warp
  /// reads its A fragment by one ldmatrix.x4 per k step (1 per 8 mma of S = Q·Kᵀ), so no
  /// registers hold Q: __launch_bounds__(256, 2) caps a thread at 128 registers and two blocks
  /// (16 warps) share an SM, one block's softmax overlapping the other's tensor-core work.
  /// Shared memory 69.6 KB + group·16·(hd + 8)·2 B = 102 KB per block at group 8, head_dim 128
  /// (two blocks: 204 KB of the 227 KB an H100/H200 SM offers); the largest carveout is asked
  /// for. Registers (ptxas, sm_90): 128 at head_dim 128, 120 at 64, 89 at 32, no spills (the
  /// baseline: 210, 158, 102). S's K fragments come by ldmatrix.x2 (one per mma) to fit. One
  /// __syncthreads per key tile, as one_barrier.
  two_blocks,
  /// One block per (32 queries, KV head), one warp per query head owning all 32 rows as two m16
  /// tiles, so every K fragment (S) and V fragment (P·V) read by ldmatrix feeds two mma instead
  /// of one. Q (bf16) in
  /// shared memory per warp, read by ldmatrix.x4 per k step and m tile; K/V tiles of 64 keys,
  /// double-buffered, one __syncthreads per tile, each tile in two online-softmax steps of 32
  /// keys (S 32 × 32). Per thread O is 128 and S 32 fp32 registers, __launch_bounds__(256, 1):
  /// one block (8 warps) per SM. Shared memory 69.6 KB + group·32·(hd + 8)·2 B = 136 KB at
  /// group 8, head_dim 128. Registers (ptxas, sm_90): 240 at head_dim 128, 156 at 64, 113 at
  /// 32, no spills. Shared memory read per mma: S 256 B (Q 2 × 512 B and K 4 × 256 B per k step
  /// and 8 mma), P·V 128 B, against the baseline's 256 B for both.
  wide_rows,
  /// wide_rows with each (32 queries, KV head) split over two blocks of group / 2 warps (heads),
  /// so two independent blocks share an SM (registers: 2 · 4 warps · 32 · 240 <= 65536; shared
  /// memory 69.6 + 34.8 = 104 KB per block at group 8, head_dim 128) and one block's barrier or
  /// softmax does not stall the other; each K/V tile is staged twice as often (once per block).
  /// Falls back to wide_rows for an odd group or n_kv_heads > 32767.
  wide_split,
};

/// Every variant, in declaration order (tests and benches loop over it).
inline constexpr FlashVariant k_flash_variants[] = {FlashVariant::baseline, FlashVariant::one_barrier, FlashVariant::two_blocks,
                                                    FlashVariant::wide_rows, FlashVariant::wide_split};

/// "baseline", "one_barrier", "two_blocks", "wide_rows" or "wide_split" (the values of
/// SERVEDECK_FLASH_VARIANT).
const char* to_string(FlashVariant variant);

/// Sets out and returns true when text is a variant's to_string; false (out untouched) otherwise.
bool parse_flash_variant(std::string_view text, FlashVariant& out);

/// The variant the launcher without a variant argument runs: set_flash_variant's last value, or
/// else the environment variable SERVEDECK_FLASH_VARIANT read once at the first call ("baseline",
/// "one_barrier", "two_blocks", "wide_rows", "wide_split"); unset or empty means baseline, and an
/// unknown value means baseline after one line on stderr naming the value read and the values
/// expected. Thread-safe.
FlashVariant flash_variant();

/// Selects the variant for the whole process (overrides SERVEDECK_FLASH_VARIANT). Thread-safe.
void set_flash_variant(FlashVariant variant);

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
