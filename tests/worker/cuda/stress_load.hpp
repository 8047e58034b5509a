// Background load for the handshake stress test: kernels on another stream that occupy SMs (their
// threads, registers and shared memory) for set times, so that the decode step's blocks are
// placed late and in another order than on an idle GPU.
#pragma once

#include <cstddef>

#include <cuda_runtime.h>

namespace gpu_test {

/// Enqueues on `stream`: one block that sleeps `delay_ns`, then `blocks` blocks of `threads`
/// threads with `smem` bytes of dynamic shared memory (<= 96 KB) that each stay resident for
/// `hold_ns` (the %globaltimer clock). Throws CudaError on a launch failure.
void launch_sm_load(cudaStream_t stream, unsigned delay_ns, int blocks, int threads, std::size_t smem, unsigned hold_ns);

}  // namespace gpu_test
