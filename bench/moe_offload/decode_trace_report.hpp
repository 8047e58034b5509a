// The decode step's timeline from a trace build (-DSERVEDECK_DECODE_TRACE=ON; see
// worker/cuda/decode_trace.cuh): one replay of the captured step is recorded block by block and
// summarised per kernel of a MoE layer, averaged over the middle layers.
#pragma once

#include "worker/cuda/cuda_backend.hpp"

namespace servedeck::bench {

/// Replays the backend's decode graph (its last step) once with recording on and prints, per kernel of a MoE layer
/// (qkv, attention, o-proj, router, gate_up, down; layers [8, n_layers - 8)), in µs, means
/// over those layers: `span` (predecessor's end → this kernel's end, i.e. its share of the
/// critical path), `lead` (first block waiting → predecessor's end: how long its pre-wait loads
/// had), `late` (first → last block through the wait), `tail` (this kernel's end → its last
/// block's end as recorded by the block itself). Prints "trace: not built" in normal builds.
void decode_trace_report(worker::cuda::CudaBackend& backend);

}  // namespace servedeck::bench
