// Decode-step timeline (internal to worker/cuda; built only with -DSERVEDECK_DECODE_TRACE=ON, a
// benchmark build): every block of every fused decode kernel records, by its thread 0, when it
// started, when it reached griddepcontrol.wait, when the wait returned and when it finished (and,
// in staging kernels, when its rows were all in shared memory: SERVEDECK_TRACE_STAGED), read from
// %globaltimer (ns, one clock for the whole device). From that the benchmark
// reconstructs, per kernel of the step, when its blocks were scheduled relative to their
// predecessor's end (did the weights it stages before the wait have time to stream?) and how long
// each phase held the critical path. Nothing is recorded in normal builds: the macros expand to
// nothing and wait_for_predecessor() is the plain pair of griddepcontrol instructions.
//
// Slots: a record goes to slot (gridid * 1024 + blockIdx.x) mod k_decode_trace_slots, no atomics
// (an atomic's round trip would sit on the block's critical path). Records carry their grid id;
// the reader groups them by it and takes the last step's grids by time. Grid ids that collide
// modulo 4096 overwrite each other's blocks (the reader prints how many grids it found), and a
// grid of more than 1024 blocks (lm_head's row-per-warp grid: 1056 on 132 SMs) writes its
// blocks from 1024 on into the next grid id's slots; records keep their own grid id, so such a
// record is lost only if the grid with the next id writes the same slot.
#pragma once

#include <cstdint>

#include "worker/cuda/decode_trace.hpp"

#ifdef SERVEDECK_DECODE_TRACE
namespace servedeck::worker::cuda::detail {

// One per translation unit (no relocatable device code); set_decode_trace_buffer() sets each.
// In constant memory: a record's pointer is then read through the constant cache, not by a
// global load that could queue in the SM's memory queue behind copies still in flight and date
// the mark late by their drain (the "waited" marks of staging kernels, whose own copies are in
// flight at their wait, and any mark behind the copies of other blocks on the same SM, e.g. a
// successor's pre-wait stage).
static __constant__ DecodeTraceRecord* g_decode_trace = nullptr;

__device__ __forceinline__ unsigned long long trace_now() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

/// The SM's cycle counter (%clock64).
__device__ __forceinline__ unsigned long long trace_clock() {
  unsigned long long c;
  asm volatile("mov.u64 %0, %%clock64;" : "=l"(c));
  return c;
}

__device__ __forceinline__ DecodeTraceRecord* trace_slot() {
  DecodeTraceRecord* buf = g_decode_trace;
  if (buf == nullptr || threadIdx.x != 0) return nullptr;
  unsigned long long grid;
  asm volatile("mov.u64 %0, %%gridid;" : "=l"(grid));
  const unsigned long long slot = (grid * 1024ull + blockIdx.x) % k_decode_trace_slots;
  DecodeTraceRecord* r = buf + slot;
  r->grid = grid;
  r->block = blockIdx.x;
  unsigned sm;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
  r->sm = sm;
  return r;
}

/// Records the block's start and end (its thread 0's) around the kernel body, in %globaltimer ns
/// and in its SM's %clock64 cycles (their ratio is the SM clock while the step ran).
struct TraceScope {
  unsigned long long start = trace_now();
  unsigned long long clk = trace_clock();
  __device__ ~TraceScope() {
    if (DecodeTraceRecord* r = trace_slot()) {
      r->c_end = trace_clock();
      r->c_start = clk;
      r->t_start = start;
      r->t_end = trace_now();
    }
  }
};

/// Records when the block's staged rows are all in shared memory (after the stage's wait and
/// the __syncthreads that publishes it).
__device__ __forceinline__ void trace_staged() {
  if (DecodeTraceRecord* r = trace_slot()) r->t_staged = trace_now();
}

/// Records when the block's warps are done with their partial sums (the staged GEMVs' over their
/// staged rows, the downs' over their experts' rows: after the __syncthreads that gathers them,
/// before the block's final sums and stores).
__device__ __forceinline__ void trace_summed() {
  if (DecodeTraceRecord* r = trace_slot()) r->t_summed = trace_now();
}

}  // namespace servedeck::worker::cuda::detail
#define SERVEDECK_TRACE_BLOCK() ::servedeck::worker::cuda::detail::TraceScope servedeck_trace_scope_
#define SERVEDECK_TRACE_STAGED() ::servedeck::worker::cuda::detail::trace_staged()
#define SERVEDECK_TRACE_SUMMED() ::servedeck::worker::cuda::detail::trace_summed()
#define SERVEDECK_TRACE_TU_SETTER(name)                                                          \
  namespace servedeck::worker::cuda {                                                            \
  void name(DecodeTraceRecord* buf) {                                                            \
    CUDA_CHECK(cudaMemcpyToSymbol(detail::g_decode_trace, &buf, sizeof buf));                    \
  }                                                                                              \
  }
#else
#define SERVEDECK_TRACE_BLOCK() static_cast<void>(0)
#define SERVEDECK_TRACE_STAGED() static_cast<void>(0)
#define SERVEDECK_TRACE_SUMMED() static_cast<void>(0)
#define SERVEDECK_TRACE_TU_SETTER(name)
#endif
