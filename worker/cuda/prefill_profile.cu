// Per-phase timing of prefill chunks for the benchmark (backend_impl.cuh, PrefillProfile).
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "worker/cuda/backend_impl.cuh"

namespace servedeck::worker::cuda::detail {

void PrefillProfile::begin(int layers) {
  // A diagnostic (docs/cuda-backend.md, "Measuring"): SERVEDECK_PREFILL_PROFILE set and not "0".
  const char* v = std::getenv("SERVEDECK_PREFILL_PROFILE");
  on = v != nullptr && *v != '\0' && std::strcmp(v, "0") != 0;
  if (!on) return;
  const std::size_t want = static_cast<std::size_t>(layers) * k_points;
  while (ev.size() < want) {
    cudaEvent_t e = nullptr;
    CUDA_CHECK(cudaEventCreate(&e));
    ev.push_back(e);
  }
}

void PrefillProfile::mark(int layer, int point, cudaStream_t s) const {
  if (on) CUDA_CHECK(cudaEventRecord(ev[static_cast<std::size_t>(layer) * k_points + static_cast<std::size_t>(point)], s));
}

void PrefillProfile::report(int n, int layers) const {
  if (!on) return;
  // Every MoE layer's last point (a dense layer's events are never recorded: cudaEventSynchronize
  // returns at once), so that a model whose last layer is dense does not read MoE layers' events
  // before they complete (cudaEventElapsedTime: not ready, and the layer silently dropped).
  for (int l = 0; l < layers; ++l)
    CUDA_CHECK(cudaEventSynchronize(ev[static_cast<std::size_t>(l) * k_points + (k_points - 1)]));
  double sum[k_points - 1] = {};
  int counted = 0;
  for (int l = 0; l < layers; ++l) {
    float t[k_points - 1];
    bool ok = true;
    for (int p = 0; p + 1 < k_points && ok; ++p)
      ok = cudaEventElapsedTime(&t[p], ev[static_cast<std::size_t>(l) * k_points + static_cast<std::size_t>(p)],
                                ev[static_cast<std::size_t>(l) * k_points + static_cast<std::size_t>(p) + 1]) == cudaSuccess;
    if (!ok) {  // a dense layer records no MoE points
      (void)cudaGetLastError();
      continue;
    }
    for (int p = 0; p + 1 < k_points; ++p) sum[p] += t[p];
    ++counted;
  }
  std::fprintf(stderr,
               "prefill profile: %d tokens, %d MoE layers, ms summed over layers: qkv %.2f | attention+o-proj+router %.2f | "
               "host plan %.2f | experts %.2f | reduce %.2f\n",
               n, counted, sum[0], sum[1], sum[2], sum[3], sum[4]);
}

PrefillProfile::~PrefillProfile() {
  for (cudaEvent_t e : ev) cudaEventDestroy(e);
}

}  // namespace servedeck::worker::cuda::detail
