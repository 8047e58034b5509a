// The flash prefill attention kernel alone, for bench_moe_offload (GPU machine only).
#pragma once

namespace servedeck::bench {

/// Times launch_flash_attention_prefill on the benchmark's attention shape (32 query / 4 KV heads
/// of 128, one layer, pos0 0, bf16 K/V) at 512, 4096 and 16384 tokens and prints ms per layer and
/// TFLOP/s of the causal work (2 products × 2 FLOPs per multiply-add × head_dim × heads ×
/// n(n+1)/2 query-key pairs), the median of 3 timed launches after a warm-up (CUDA events), for
/// every cuda::FlashVariant: the baseline's table first (as before), then one table per other
/// variant (two_blocks, the default kernel; wgmma; wgmma_wide) with its speed-up over the baseline
/// (baseline ms / variant ms), each table printed and flushed as soon as its variant is timed.
/// The wgmma tables say when the build has no sm_90a code (then they time the two_blocks
/// fallback); SERVEDECK_FLASH_BENCH_SKIP_WGMMA=1 skips them (e.g. after test_worker_cuda_flash
/// failed on them).
/// Throws CudaError on a CUDA failure.
void flash_attention_bench();

}  // namespace servedeck::bench
