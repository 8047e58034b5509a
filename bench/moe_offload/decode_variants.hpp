// The decode step's A/B switches measured on one loaded model, for bench_moe_offload --variants
// (GPU machine only).
#pragma once

#include <string>

#include "worker/cuda/cuda_backend.hpp"

namespace servedeck::bench {

/// All experts resident (set_hot_slots(128)), PDL on. For the baseline (no variable set) first
/// and last, and each ';'-separated set of ','-separated "NAME=value" pairs in `spec` between
/// them: sets the variables (unsetting every name the spec mentions first), builds a new cache
/// (so a new decode graph, whose launchers read the switches, fused_launch.cuh env_knob), runs a
/// `prompt`-token prompt and `decode` greedy tokens, and prints one row: the set, tok/s over the
/// decoded tokens, and the graph alone in ms (decode_step_us, 32 replays at the last position).
/// Unsets every mentioned variable at the end. Returns 0 (the process exit status).
int run_decode_variants(servedeck::worker::cuda::CudaBackend& backend, const std::string& spec, int prompt, int decode);

}  // namespace servedeck::bench
