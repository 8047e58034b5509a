// Causal prefill attention on tensor cores, flash-style: each block streams key/value tiles of
// the KV cache through shared memory and keeps a running (max, sum) softmax per query row, so
// the (queries × keys) score matrix never reaches device memory (Dao et al., "FlashAttention",
// 2022, online softmax of Milakov & Gimelshein 2018).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>


namespace servedeck::worker::cuda {

/// The kernels of launch_flash_attention_prefill. All keep its numerics contract (same roundings,
/// log2-domain online softmax of 64-key steps, masking, fp32 running max/sum/output) with each S
/// entry adding its k steps in the same order, so their outputs agree to ~1e-5
/// (flash_attention_test.cpp; on the H200 they matched bitwise). Which one runs is a matter of the
/// device and the shape alone (flash_kernel_for); timings: docs/performance.md, 2026-11-30 "flash
/// prefill attention".
enum class FlashKernel {
  /// One block per (16 queries, KV head), one warp per query head of the group, each warp's Q
  /// fragments in registers, K/V tiles of 64 keys double-buffered by cp.async (2·2·64·(hd + 8)·2 B:
  /// 69.6 KB at head_dim 128), two __syncthreads per key tile, one block per SM (210 registers at
  /// head_dim 128). The kernel where mma_two_blocks' shared memory does not fit the block (group 8
  /// at head_dim 128 on a 99 KB card: SM89, SM120).
  mma,
  /// mma's blocks, tiles and loop, with the block's Q (group · 16 rows × hd bf16) written once into
  /// shared memory after the K/V buffers and read by ldmatrix per k step, so no registers hold Q:
  /// <= 128 registers, two blocks (16 warps) share an SM, one __syncthreads per key tile. 69.6 KB +
  /// group·16·(hd + 8)·2 B (102 KB at group 8, head_dim 128). The kernel wherever wgmma cannot run
  /// and its shared memory fits.
  mma_two_blocks,
  /// Hopper warpgroup MMA (flash_wgmma.cuh; sm_90a builds only): 16 warps (four warpgroups) per
  /// block, 16·16 / G queries × the group's heads, each K/V tile in shared memory serving 256
  /// query rows; S and O by wgmma.mma_async from shared memory, 128 registers, 129 KB. head_dim 128
  /// with a group that is a multiple of 4 on a compute capability 9.0 device running sm_90a code.
  /// A group above 8 (GLM-4.5-Air: 12, up to 16) is split over blocks of 8 or 4 of its heads
  /// (12 → 3 × 4, 16 → 2 × 8) that each stream the KV head's tiles: every tile still serves 256
  /// query rows, so the K/V traffic per query row is that of group 4 or 8. The mma kernels split
  /// such a group likewise into blocks of its largest divisor <= 8 heads (12 → 2 × 6).
  wgmma,
};

/// "mma", "mma_two_blocks" or "wgmma".
const char* to_string(FlashKernel kernel);

/// True when the wgmma kernel is in this build for the current device: flash_attention.cu
/// compiled for sm_90a (its device code has __CUDA_ARCH_FEAT_SM90_ALL) and that code is what the
/// runtime loads. Probed once per process by a one-thread kernel and a synchronous copy (not
/// callable inside a stream capture the first time); a failed probe reads as false.
bool flash_wgmma_available();

/// True when `kernel` runs this shape (flash_attention_supported) on the current device: wgmma
/// needs head_dim 128, a group that is a multiple of 4 and flash_wgmma_available(); every kernel needs its shared
/// memory to fit the block (detail::smem_per_block, fused_launch.cuh).
bool flash_kernel_runs(FlashKernel kernel, int n_heads, int n_kv_heads, int head_dim);

/// The kernel launch_flash_attention_prefill runs for this shape on the current device: wgmma
/// where it runs, else mma_two_blocks where it fits, else mma.
FlashKernel flash_kernel_for(int n_heads, int n_kv_heads, int head_dim);

/// True when launch_flash_attention_prefill handles this shape: head_dim 32, 64 or 128 and
/// n_heads a multiple of n_kv_heads with n_heads / n_kv_heads <= 16 (one warp per query head; a
/// group above 8 is split over several blocks, see FlashKernel).
bool flash_attention_supported(int n_heads, int n_kv_heads, int head_dim);

/// out[i, h·hd : (h+1)·hd] = softmax_j(q_i,h · k_j / sqrt(hd)) · v_j over keys j in [0, pos0 + i],
/// for chunk rows i < n (query i sits at position pos0 + i) and query heads h < n_heads; KV head
/// of h = h / (n_heads / n_kv_heads) (GQA).
///   q: (n, ldq) fp32, head h of row i at q + i·ldq + h·hd (already q-normed and rotated);
///   k, v: (>= pos0 + n, n_kv_heads·hd) bf16, rows [0, pos0 + n) written (the prefill path
///         gathers the layer's rows of the bf16 KV pool into this copy before the launch);
///   out: (n, ldo) fp32.
/// Numerics are those of a bf16 engine (FlashAttention-2, transformers in bf16): q is rounded to
/// bf16, S = Q·Kᵀ and O = P·V run on bf16 tensor cores (mma.sync m16n8k16) with fp32
/// accumulation, the probabilities P are bf16 (relative rounding 2^-9) and the running sum adds
/// the rounded values, so each row's weights sum to exactly what multiplies v; the running max
/// and sum and the output stay fp32. Against fp32 attention a score moves by up to ~2^-8 of
/// |q|·|k|: on a peaked softmax that moves probabilities by percent (flash_attention_test.cpp,
/// backend_test.cpp state the measured sizes); the cuBLAS path (TF32 on an fp32 copy of the rows) is the
/// closer one.
/// The kernel is flash_kernel_for's (see FlashKernel).
/// Throws std::invalid_argument when !flash_attention_supported, n_kv_heads > 4095, n <= 0,
/// pos0 < 0, ldq/ldo odd or shorter than n_heads · head_dim, k/v not 16-byte aligned, or
/// q/out not 8-byte aligned.
void launch_flash_attention_prefill(const float* q, int ldq, const __nv_bfloat16* k, const __nv_bfloat16* v, float* out,
                                    int ldo, int n, int pos0, int n_heads, int n_kv_heads, int head_dim, cudaStream_t stream);

/// As above with an explicit kernel, for the tests and the benchmark, which run each kernel the
/// device can run; same shapes, checks and errors, and std::invalid_argument when
/// !flash_kernel_runs(kernel, ...).
void launch_flash_attention_prefill(const float* q, int ldq, const __nv_bfloat16* k, const __nv_bfloat16* v, float* out,
                                    int ldo, int n, int pos0, int n_heads, int n_kv_heads, int head_dim, cudaStream_t stream,
                                    FlashKernel kernel);

}  // namespace servedeck::worker::cuda
