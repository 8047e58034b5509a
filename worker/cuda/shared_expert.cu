// glm4_moe's shared expert (MoeDescription::shared_experts > 0): one SwiGLU of width
// shared_inter (moe_intermediate_size x n_shared_experts) on every token of a MoE layer, added
// to the routed experts' sum. Its weights are resident in VRAM (LayerDev::shared_gate_up,
// shared_down); the routed ones go through the expert store.
#include "worker/cuda/backend_impl.cuh"
#include "worker/cuda/kernels.cuh"
#include "worker/cuda/prefill.cuh"

namespace servedeck::worker::cuda {

void CudaBackend::Impl::shared_expert_decode(const detail::LayerDev& L, const float* xn_row, float* out) {
  if (L.shared_gate_up == nullptr) return;
  const int I = shared_inter(), H = hidden();
  // The staged GEMV (its rows in shared memory where they fit), launched without PDL: in stream
  // order after the routed down, whose residual the down GEMV adds to.
  launch_gemv_bf16_pdl(L.shared_gate_up, xn_row, shared_gu, 2 * I, H, false, stream);
  launch_swiglu(shared_gu, shared_gu + I, shared_act, I, stream);
  launch_gemv_bf16_pdl(L.shared_down, shared_act, out, H, I, true, stream);
}

void CudaBackend::Impl::shared_expert_prefill(const detail::LayerDev& L, int n) {
  if (L.shared_gate_up == nullptr) return;
  const int I = shared_inter(), H = hidden();
  // gate|up rows of the one matrix → (n, 2I) fp32, SwiGLU → bf16, down accumulated into the residual.
  gemm(L.shared_gate_up, 2 * I, H, pre.xb, n, H, pre.gu, 2 * I, 0.f);
  launch_swiglu_rows_bf16(pre.gu, pre.act, n, I, stream);
  gemm(L.shared_down, H, I, pre.act, n, I, pre.x, H, 1.f);
}

}  // namespace servedeck::worker::cuda
