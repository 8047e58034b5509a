// The flash prefill attention kernel alone, for bench_moe_offload (GPU machine only).
#pragma once

namespace servedeck::bench {

/// Times launch_flash_attention_prefill on the benchmark's attention shape (32 query / 4 KV heads
/// of 128, one layer, pos0 0, bf16 K/V) at 512, 4096 and 16384 tokens and prints ms per layer and
/// TFLOP/s of the causal work (2 products × 2 FLOPs per multiply-add × head_dim × heads ×
/// n(n+1)/2 query-key pairs), the median of 3 timed launches after a warm-up (CUDA events), for
/// every cuda::FlashKernel the device runs at that shape (mma first, then each other with its
/// speed-up over mma), naming the one the prefill path picks (flash_kernel_for). Each table is
/// printed and flushed as soon as its kernel is timed.
/// Throws CudaError on a CUDA failure.
void flash_attention_bench();

}  // namespace servedeck::bench
