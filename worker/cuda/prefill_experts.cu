// The routed experts of a prefill MoE layer, a batch at a time (see backend_impl.cuh,
// ExpertBatch): a gate|up GEMM per expert, one SwiGLU launch over the batch's contiguous rows,
// a down GEMM per expert. cuBLAS 13 on the H200 refused cublasGemmGroupedBatchedEx for bf16
// inputs with fp32 outputs (CUBLAS_STATUS_NOT_SUPPORTED, 2026-11-29), so the GEMMs stay
// one cublasGemmEx each (bf16 in, fp32 out, fp32 compute). Quantised experts are first
// dequantised into bf16 blocks (PrefillBuffers::dequant), one launch per expert.
#include "worker/cuda/backend_impl.cuh"
#include "worker/cuda/prefill.cuh"
#include "worker/cuda/quant_moe.cuh"

namespace servedeck::worker::cuda {

void CudaBackend::Impl::run_expert_batch(const detail::ExpertBatch& batch) {
  const std::size_t nb = batch.weights.size();
  if (nb == 0) return;
  const int H = hidden(), I = static_cast<int>(d.moe.intermediate_size);
  const std::size_t row0 = static_cast<std::size_t>(batch.offsets.front());
  const std::size_t rows = static_cast<std::size_t>(batch.offsets.back() + batch.counts.back()) - row0;
  std::vector<const bf16*> w(batch.weights);
  if (store->format() != ExpertFormat::bf16) {
    const std::size_t elems = 3 * static_cast<std::size_t>(I) * static_cast<std::size_t>(H);
    for (std::size_t j = 0; j < nb; ++j) {
      launch_dequantize_expert(store->table(0), batch.weights[j], pre.dequant + j * elems, stream);
      w[j] = pre.dequant + j * elems;
    }
  }
  for (std::size_t j = 0; j < nb; ++j) {
    const std::size_t off = static_cast<std::size_t>(batch.offsets[j]);
    gemm(w[j], 2 * I, H, pre.xp + off * H, batch.counts[j], H, pre.gu + off * 2 * I, 2 * I, 0.f);
  }
  launch_swiglu_rows_bf16(pre.gu + row0 * 2 * I, pre.act + row0 * I, static_cast<int>(rows), I, stream);
  for (std::size_t j = 0; j < nb; ++j) {
    const std::size_t off = static_cast<std::size_t>(batch.offsets[j]);
    gemm(w[j] + static_cast<std::size_t>(2) * I * H, H, I, pre.act + off * I, batch.counts[j], I,
         pre.partial + off * H, H, 0.f);
  }
}

}  // namespace servedeck::worker::cuda
