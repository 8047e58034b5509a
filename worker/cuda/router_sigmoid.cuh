// Launchers of the sigmoid router (glm4_moe, RouterKind::sigmoid_bias_topk; worker/model/config.hpp),
// the decode step's and the prefill chunk's. The softmax router of Qwen3-MoE keeps its own
// kernels (fused_router.cu, router.cu, prefill.cu); these share none of its arithmetic.
//
// Per token, in fp32, as the CPU backend's route_sigmoid (worker/cpu/cpu_backend.cpp):
//   score[e]  = 1 / (1 + exp(-logit[e]))
//   choice[e] = score[e] + bias[e]                       (e_score_correction_bias: the choice only)
//   n_group > 1: a group's score is the sum of its two best choices; the experts outside the
//                topk_group best groups get choice 0 (transformers' masked_fill value)
//   ids       = the k largest choices (ties → lower id), in rank order
//   weight[j] = score[ids[j]] / (sum_r score[ids[r]] + 1e-20) when renormalise (the sum in rank
//               order), else score[ids[j]]; times `scale` (routed_scaling_factor)
#pragma once

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "worker/cuda/fused.cuh"

namespace servedeck::worker::cuda {

/// The routing parameters of a sigmoid router beside its logits.
struct SigmoidRouter {
  const float* bias = nullptr;  // (n_experts) fp32, device: e_score_correction_bias of the layer
  int n_group = 1;              // expert groups, n_experts / n_group experts each
  int topk_group = 1;           // groups a token may route into
  bool renormalise = true;      // norm_topk_prob
  float scale = 1.f;            // routed_scaling_factor
};

/// The decode step's sigmoid router (in place of launch_router_fused for glm4_moe):
/// xn_out = rmsnorm(x) ⊙ norm_w; o.logits = R · xn (fp32, one warp per expert); the last block
/// to finish picks o.ids and o.weights (k of them) by the rule in this header's comment and
/// counts hits/misses and the layer's routing counts. R: (n_experts, hidden) bf16; x, xn_out:
/// (hidden) fp32. With pdl it reads R and norm_w before waiting for its predecessor.
/// Requirements (std::invalid_argument): n_experts in (0, 1024], k in (0, min(n_experts, 32)],
/// n_group in [1, 64] dividing n_experts, topk_group in [1, n_group] with k <= topk_group ·
/// n_experts / n_group, hidden a multiple of 8 and <= 12288, R, x and xn_out 16-byte aligned,
/// norm_w 8-byte aligned, r.bias and o.done set (o.done: one zeroed counter; its last block
/// resets it).
void launch_router_sigmoid_fused(const __nv_bfloat16* R, const float* x, const __nv_bfloat16* norm_w, float eps, float* xn_out,
                                 int n_experts, int hidden, int k, const SigmoidRouter& r, const RouterOutputs& o,
                                 cudaStream_t stream, bool pdl = false);

/// The prefill chunk's sigmoid router: for each of `rows` rows of logits (rows, n) fp32, the
/// ids and weights (rows, k) by the rule in this header's comment; counts routes like the
/// decode router (hot_flags, counters, layer_counts). Same requirements on n, k and r as
/// launch_router_sigmoid_fused (std::invalid_argument). rows == 0 launches nothing.
void launch_router_sigmoid_rows(const float* logits, int rows, int n, int k, const SigmoidRouter& r, int32_t* ids,
                                float* weights, const uint8_t* hot_flags, unsigned long long* counters,
                                unsigned long long* layer_counts, cudaStream_t stream);

}  // namespace servedeck::worker::cuda
