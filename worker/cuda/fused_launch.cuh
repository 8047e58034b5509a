// Launch helpers shared by the fused decode kernels (internal to worker/cuda): the PDL wait,
// the launch with the programmatic-serialization attribute, grid sizing.
#pragma once

#include <climits>
#include <cstddef>
#include <cstdlib>

#include <cuda_runtime.h>

#include "worker/cuda/cuda_check.hpp"
#include "worker/cuda/decode_trace.cuh"

namespace servedeck::worker::cuda::detail {

/// Multiprocessors of the current device (read once).
inline int sm_count() {
  static const int n = [] {
    int dev = 0, v = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev));
    return v;
  }();
  return n;
}

// Programmatic dependent launch: a kernel launched with `pdl` may be scheduled while its
// predecessor in the stream finishes; it waits here, before reading anything the predecessor
// (or an earlier kernel of the step) wrote, until the predecessor has completed and its writes
// are visible. Only then does it let its own dependent be scheduled. That order is a contract
// the decode step relies on: a fused kernel lets its dependent launch only once it has waited
// (the exceptions below), so kernel N+1 cannot start before kernel N-1 has finished —
// moe_down_fused reads the ids (the router's, two launches back, or with gate/up ranks gate/up's,
// fenced before it triggers) and the residual (three back)
// before its own wait, the staged o-proj the residual (three back), the attention the position
// (copied by the host before the step). Weights, never written, may be read before it.
// Exceptions to "only after its wait" (with the handshakes below, what a kernel reads early is
// published to it, not complete by launch order):
// - the folded router (launch_router_folded) lets gate/up launch at its start, so gate/up may
//   start while the o-proj, two launches back, still runs; gate/up therefore reads nothing but
//   weights before its own wait (which returns only once the router, and through the router's
//   own wait the o-proj, have completed) — except the ids of the early ids below, and with the
//   early x the o-proj's x and the router's logits, after which it lets the down launch and
//   waits for the router only at its end;
// - the attention (launch_attention_decode_fused, unless SERVEDECK_ATTN_EARLY_TRIGGER=0) lets the
//   o-proj launch at its start, so the o-proj may start while q|k|v, two launches back, still
//   runs; before its wait the o-proj reads its weights and the residual, last written by the
//   down before q|k|v (complete once q|k|v passed its own wait, which precedes the attention's
//   launch);
// - with the early routing (below) the o-proj lets the folded router launch at its start; the
//   router reads the residual (as the o-proj) and, only after the heads' count, the attention's
//   output; only its last block waits for the o-proj (the others return without a wait), so its
//   completion still implies the o-proj's.
// Without PDL both instructions do nothing.
__device__ __forceinline__ void wait_for_predecessor() {
#ifdef SERVEDECK_DECODE_TRACE
  const unsigned long long t_wait = trace_now();
#endif
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" :::);
#ifdef SERVEDECK_DECODE_TRACE
  if (DecodeTraceRecord* r = trace_slot()) {
    r->t_wait = t_wait;
    r->t_waited = trace_now();
  }
#endif
}

// Four handshakes of the decode step that run ahead of the PDL order (fused_launch's
// wait_for_predecessor): polls of a counter in global memory, published with release and read
// with relaxed loads and one acquire fence (not an acquire per poll, which would invalidate the
// SM's L1 each time under the kernels beside it). Each counter is cleared only where every block
// that polls it is known to have passed its poll; the launchers take their pointers one by one,
// so a caller must pass each counter to all of its publishers, pollers and its clearer, as the
// decode step does (a counter left non-zero would let the next poll pass at once on stale data).
// A counter that carried an epoch (step × layer) instead of 0/1 would need no clearing: not done.
// - Early ids (SERVEDECK_EARLY_IDS): the folded router's last block publishes the routed ids
//   (publish_flag) once written; gate/up's blocks wait for it (wait_for_count(flag, 1)) BEFORE
//   their PDL wait and start loading their first expert rows; the down clears the flag after its
//   own wait (every gate/up block has passed it by then). gate/up is launched at the router's
//   start, when every router block is resident, so the last block always gets to publish.
// - Early routing (SERVEDECK_EARLY_ROUTE): the attention's merging block of each head adds 1
//   (publish_count) once the head's output is written; the folded router, launched at the
//   o-proj's start instead of after its wait, computes the residual's part of its logits, then
//   waits for all heads (wait_for_count(done, n_heads)) and reads the attention's output; its
//   last block clears the count. The router is launched once every o-proj block started, the
//   o-proj once every attention block did: the attention's blocks are all resident, so the
//   count always completes.
// - Early x (SERVEDECK_EARLY_X, off by default: measured slower): every o-proj block adds 1 once
//   its rows of x are written; gate/up's blocks wait for all of them instead of their PDL wait,
//   then let the down launch, and wait for the router only at their end; the down clears the
//   count after its own wait.
// - Gate/up ranks (SERVEDECK_GATE_UP_RANKS, with the early ids): the folded router has no last
//   block; each block adds 1 (publish_count) once its logit is written, and only block 0 waits
//   for the o-proj. gate/up's blocks wait for all n_experts counts before their PDL wait, load
//   the logits and rank them themselves (block_topk_by_rank_split: the router's last block's
//   experts and order); gate/up's block 0 writes the ids for the down, the hit counters, clears
//   the early routing's count and fences the ids before it lets the down launch (the down reads them
//   before its own wait; no flag: a flag cleared by the down's block 0 hung down blocks placed
//   later that still polled it, session 13 run 6). The down clears the count after its wait.
//   Measured on the H200 (session 14 run 1, GPU step at position ~190): 2.251 ms against 2.300.

/// Stores 1 to `flag` (release, device scope): this thread's earlier writes, and with a
/// __syncthreads before it its block's, are visible to whoever reads the 1 and then fences.
__device__ __forceinline__ void publish_flag(unsigned int* flag) {
  asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(flag), "r"(1u) : "memory");
}

/// Adds 1 to `count` (release, device scope), as publish_flag.
__device__ __forceinline__ void publish_count(unsigned int* count) {
  asm volatile("red.release.gpu.global.add.u32 [%0], %1;" ::"l"(count), "r"(1u) : "memory");
}

/// The last-block pattern's counter in one operation: old value of `*count` after adding 1, with
/// acquire and release at device scope. Called by thread 0 after a __syncthreads that follows
/// its block's writes, it publishes them (the barrier orders them before the release) and, for
/// the last block, makes every other block's published writes visible (to its block after the
/// next __syncthreads; loads of them must bypass L1). Replaces __threadfence by every thread +
/// atomicAdd + __threadfence: one round trip instead of three.
__device__ __forceinline__ unsigned int atomic_inc_acq_rel(unsigned int* count) {
  unsigned int old;
  asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;" : "=r"(old) : "l"(count) : "memory");
  return old;
}

/// The last-block pattern's arrival, for a block whose writes precede the call: true in the
/// block that arrives `n`-th at counters[i] (its threads then see every other block's writes; loads
/// of them must bypass L1). With lean_sync one atomic_inc_acq_rel by thread 0, else
/// __threadfence by every thread + atomicAdd + __threadfence in the last block. Contains the
/// __syncthreads around the arrival; `is_last` is the block's shared flag.
__device__ __forceinline__ bool arrive_last(unsigned int* counters, int i, unsigned int n, int lean_sync, int& is_last) {
  if (!lean_sync) __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) is_last = (lean_sync ? atomic_inc_acq_rel(&counters[i]) : atomicAdd(&counters[i], 1u)) == n - 1u;
  __syncthreads();
  if (!is_last) return false;
  if (!lean_sync) __threadfence();
  return true;
}

/// Returns once `count` reads at least `n` (relaxed polls every ~64 ns, then one acquire fence:
/// the writes published before it are visible to this thread, and after a __syncthreads to its
/// block — loads of them must bypass L1: __ldcg or ld.relaxed, not the read-only path).
__device__ __forceinline__ void wait_for_count(const unsigned int* count, unsigned int n) {
  for (;;) {
    unsigned int v;
    asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(count) : "memory");
    if (v >= n) break;
    __nanosleep(64);
  }
  asm volatile("fence.acq_rel.gpu;" ::: "memory");
}

/// Lets `kernel` launch with up to `max_bytes` of dynamic shared memory on the current device
/// (the default limit is 48 KB including static shared memory). Call with the kernel's fixed
/// maximum, never a per-launch size: the attribute belongs to the function, so a smaller later
/// value would lower the limit for every launch.
template <class Kernel>
inline void allow_dynamic_smem(Kernel kernel, std::size_t max_bytes) {
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(max_bytes)));
}

/// Asks for the largest shared-memory carveout while `kernel` runs, so that a block of the next
/// kernel with a large shared-memory stage (launched early by PDL) fits on the same SM: the SM's
/// L1/shared split is set when a kernel's blocks are placed and cannot grow under running blocks.
template <class Kernel>
inline void prefer_max_shared(Kernel kernel) {
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared));
}

template <class... KArgs, class... Args>
inline void launch(void (*kernel)(KArgs...), int grid, int block, std::size_t smem, cudaStream_t stream, bool pdl, Args... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(static_cast<unsigned>(grid));
  cfg.blockDim = dim3(static_cast<unsigned>(block));
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl ? 1 : 0;
  CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, static_cast<KArgs>(args)...));
}

/// The integer in environment variable `name`, or `def` when it is unset, not a whole decimal
/// number ("16abc") or outside int's range: the decode step's A/B switches for the benchmark
/// (docs/cuda-backend.md lists them). Read at each call, so a graph captured after setenv uses
/// the new value.
inline int env_knob(const char* name, int def) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return def;
  char* end = nullptr;
  const long n = std::strtol(v, &end, 10);  // LONG_MIN / LONG_MAX on overflow: out of int's range below
  return *end == '\0' && n >= INT_MIN && n <= INT_MAX ? static_cast<int>(n) : def;
}

/// 1 unless SERVEDECK_REDUCE_SCATTER=0: the staged GEMVs and the down reduce each group of 8
/// rows with one reduce-scatter (detail::store_row_sums8) instead of a shuffle tree per row (A/B).
inline int reduce_scatter_knob() { return env_knob("SERVEDECK_REDUCE_SCATTER", 1) != 0 ? 1 : 0; }

/// 1 unless SERVEDECK_LEAN_SYNC=0: the attention's and the folded router's last-block patterns
/// with atomic_inc_acq_rel instead of fences (A/B).
inline int lean_sync_knob() { return env_knob("SERVEDECK_LEAN_SYNC", 1) != 0 ? 1 : 0; }

/// Blocks for `rows` rows at `warps` warps per block and one row per warp, capped at what the
/// device holds at full occupancy (the kernels loop over rows beyond it).
inline int grid_for(int rows, int warps) {
  const int want = (rows + warps - 1) / warps;
  const int cap = sm_count() * (2048 / (warps * 32));
  return want < cap ? want : cap;
}


}  // namespace servedeck::worker::cuda::detail
