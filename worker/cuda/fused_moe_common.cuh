// What the routed experts' decode kernels share (internal to worker/cuda): gate/up
// (fused_moe.cu) and the down (fused_moe_down.cu).
#pragma once

namespace servedeck::worker::cuda {

/// Warps per block of the routed experts' decode kernels (gate/up and the down).
constexpr int k_moe_warps = 8;

}  // namespace servedeck::worker::cuda
