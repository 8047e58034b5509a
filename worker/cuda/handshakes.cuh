// The decode step's kernel-to-kernel handshakes (internal to worker/cuda): what runs ahead of the
// PDL order of fused_launch.cuh, the counters that carry it, and why none of it can deadlock or
// read stale data. Every other cross-kernel dependency of the step is the PDL order itself: a
// kernel reads what earlier kernels wrote only after wait_for_predecessor.
//
// Launch order. Three kernels let their dependent launch at their start (trigger_dependents)
// instead of after their wait: the attention (the o-proj may start), the staged o-proj of a
// folded-router layer (the folded router may start) and the folded router (gate/up may start).
// A dependent grid is launched only once every block of its predecessor has triggered or exited,
// so while any block of the router runs, every block of the o-proj and of the attention has
// started; while any gate/up block runs, every router block has started. The arguments below
// use only that fact and the PDL order.
//
// Counters. Two kinds, and no other reset anywhere:
// - Arrival counters inside one grid (H1, and the argmax's and the unfolded router's last block):
//   touched only by the blocks of one launch, once each; the block that arrives last (and so
//   knows every arrival happened) resets it to 0 before its grid ends. The next launch that
//   touches it arrives only after its own PDL wait, i.e. after this grid completed.
// - Cross-grid counters (H2, H3): one slot per MoE layer (StepSync), never reset. Each step adds
//   exactly n to a slot (its publishers, once each), so after `epoch` steps it holds epoch · n
//   (mod 2^32). A consumer of the step reads the epoch (steps completed: advanced by the step's
//   last kernel, launch_argmax_row's last block, after everything else of the step completed)
//   and waits until the slot reaches (epoch + 1) · n (step_target; compared modulo 2^32 by
//   reached(), so the counters may wrap). The epoch is constant while a step runs: the next step
//   starts only after the graph (or the stream's kernels) of this one completed, and the step's
//   first kernel (the embedding) is launched without PDL. Requirement: every step runs every
//   layer's producers exactly once — the captured step always does.
// Publication: publish_count (red.release.gpu by thread 0 after a __syncthreads that follows
// the block's writes); consumption: wait_for_count (relaxed polls, then one fence.acq_rel.gpu;
// the block's threads read after a __syncthreads, through L2: __ldcg, never the read-only path).
//
// H1. Attention splits of a KV head (launch_attention_decode_paged). Producers: the splits
//     blocks of KV head h, each in use writing its partial (max, sum, outputs of the group's
//     heads) to scratch, the rest writing nothing. Consumer: the block that arrives last at
//     counters[h] (arrive_last: one atom.acq_rel.gpu by thread 0 after the block's barrier)
//     merges the partials of the splits in use in split order and resets counters[h]. Deadlock:
//     nothing waits.
// H2. Attention heads -> folded router (the early routing). Producer: the merging block of each
//     KV head (H1), once its group's outputs are written: heads_done[layer] += group (n_heads /
//     n_kv_heads), so a step adds n_heads in all. Consumer: every block
//     of launch_router_folded computes the residual's part of its logit, then waits for
//     n_heads publications of this step and only then reads the attention's output. Deadlock:
//     when a router block runs, every attention block has started (launch order), and attention
//     blocks wait only for q|k|v, which waits for nothing later in the step: they finish.
// H3. Router logits -> gate/up (gate/up ranks). Producer: every block e of the folded router,
//     once logits[e] is written: logits_done[layer] += 1. Consumer: every gate/up block waits for
//     n_experts publications before its PDL wait, loads the logits and ranks them itself
//     (block_topk_by_rank_split). Deadlock: every router block has started when gate/up runs
//     (launch order); a router block waits only on H2 (whose producers need nothing later) and
//     block 0 finally for the o-proj's completion, after publishing.
// H4. Gate/up's ids -> the down. Producer: gate/up's block 0 writes the ranked ids, then (after
//     its barrier) thread 0 __threadfence, before its PDL wait and the trigger that follows it.
//     Consumer: the down's blocks (bf16 and quantised) read the ids (__ldcg) before their own
//     wait and start loading their experts' rows. Ordering: the down launches only after every gate/up block triggered, block
//     0's trigger follows its fence, and the fence completes once the ids are performed at device
//     scope (L2), which the down's loads read. PDL's documented guarantee covers only reads after
//     griddepcontrol.wait; this read relies on the fence instead (an acquire poll would add an L2
//     round trip to the down's pre-wait critical path). No counter, nothing to reset: layer l+1's
//     gate/up rewrites the ids only after the down of layer l completed (it starts after q|k|v of
//     layer l+1 passed its wait). Under the unfolded router the producer is the router, two
//     launches back: the down launches only after every gate/up block triggered, and gate/up
//     (launch_moe_gate_up_fused, launch_moe_gate_up_quant) triggers only after its own wait, i.e.
//     after the router completed; such a gate/up must never trigger before that wait.
//     Deadlock: nothing waits.
// tests/worker/cuda/handshake_stress_test.cpp replays the step many times while kernels on
// another stream occupy random SMs for random times, and checks the logits bit for bit.
#pragma once

#include <cuda_runtime.h>

namespace servedeck::worker::cuda {

/// The decode step's cross-grid counters (H2, H3 above) for one MoE layer, and the step epoch.
/// Device pointers; all zeroed once at allocation and never reset.
struct StepSync {
  const unsigned int* epoch = nullptr;  // decode steps completed (mod 2^32), advanced by launch_argmax_row
  unsigned int* heads_done = nullptr;   // H2: this layer's count of attention heads written
  unsigned int* logits_done = nullptr;  // H3: this layer's count of router logits written
};

#if defined(__CUDACC__)  // the device side (fused.cuh, included by host code, needs only StepSync)
namespace detail {

/// Adds n to `count` (release, device scope): this thread's earlier writes, and with a
/// __syncthreads before it its block's, are visible to whoever sees the count and then fences.
__device__ __forceinline__ void publish_count(unsigned int* count, unsigned int n = 1u) {
  asm volatile("red.release.gpu.global.add.u32 [%0], %1;" ::"l"(count), "r"(n) : "memory");
}

/// True when counter value v has reached target t modulo 2^32 (the distance is below 2^31).
__device__ __forceinline__ bool reached(unsigned int v, unsigned int t) { return static_cast<int>(v - t) >= 0; }

/// The value a slot of `n` publications per step reaches in the step now running: (epoch + 1) · n.
__device__ __forceinline__ unsigned int step_target(const unsigned int* epoch, unsigned int n) {
  unsigned int e;
  asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(e) : "l"(epoch) : "memory");
  return (e + 1u) * n;
}

/// Returns once `count` has reached `target` (relaxed polls every ~64 ns, then one acquire
/// fence: the writes published before it are visible to this thread, and after a __syncthreads
/// to its block — loads of them must bypass L1: __ldcg or ld.relaxed, not the read-only path).
/// Not an acquire per poll, which would invalidate the SM's L1 each time under the kernels beside it.
__device__ __forceinline__ void wait_for_count(const unsigned int* count, unsigned int target) {
  for (;;) {
    unsigned int v;
    asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(count) : "memory");
    if (reached(v, target)) break;
    __nanosleep(64);
  }
  asm volatile("fence.acq_rel.gpu;" ::: "memory");
}

/// Old value of `*count` after adding 1, with acquire and release at device scope: called by
/// thread 0 after a __syncthreads that follows its block's writes, it publishes them and, for
/// the last block, makes every other block's published writes visible (to its block after the
/// next __syncthreads; loads of them must bypass L1).
__device__ __forceinline__ unsigned int atomic_inc_acq_rel(unsigned int* count) {
  unsigned int old;
  asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;" : "=r"(old) : "l"(count) : "memory");
  return old;
}

/// The arrival of an intra-grid counter (H1's kind), for a block whose writes precede the call:
/// true in the block that arrives `n`-th at counters[i] (its threads then see every other block's
/// writes; loads of them must bypass L1). That block must reset counters[i] to 0 before it ends.
/// Contains the __syncthreads around the arrival; `is_last` is the block's shared flag.
__device__ __forceinline__ bool arrive_last(unsigned int* counters, int i, unsigned int n, int& is_last) {
  __syncthreads();
  if (threadIdx.x == 0) is_last = atomic_inc_acq_rel(&counters[i]) == n - 1u;
  __syncthreads();
  return is_last != 0;
}

}  // namespace detail
#endif

}  // namespace servedeck::worker::cuda
