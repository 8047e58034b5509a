// Timing of a sequence of kernel launches as the decode step runs them: captured as one CUDA graph
// and replayed, for the benchmarks' per-kernel figures (bench_moe_offload's breakdown,
// bench_decode_attention).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <functional>
#include <vector>

#include "worker/cuda/cuda_check.hpp"

namespace servedeck::bench {

/// µs per body(i) call: body(0), ..., body(n - 1) captured on `stream` as one CUDA graph, the
/// graph launched `launches` times (CUDA events around each), the first launch dropped as a
/// warm-up, the median of the rest divided by n. CUDA errors abort (CUDA_CHECK).
inline double graph_us_per_call(cudaStream_t stream, int n, const std::function<void(int)>& body, int launches = 6) {
  cudaGraph_t g;
  cudaGraphExec_t ge;
  CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < n; ++i) body(i);
  CUDA_CHECK(cudaStreamEndCapture(stream, &g));
  CUDA_CHECK(cudaGraphInstantiate(&ge, g, 0));
  cudaEvent_t a, b;
  CUDA_CHECK(cudaEventCreate(&a));
  CUDA_CHECK(cudaEventCreate(&b));
  std::vector<double> ts;
  for (int r = 0; r < launches; ++r) {
    CUDA_CHECK(cudaEventRecord(a, stream));
    CUDA_CHECK(cudaGraphLaunch(ge, stream));
    CUDA_CHECK(cudaEventRecord(b, stream));
    CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    if (r > 0) ts.push_back(ms * 1000.0 / n);
  }
  CUDA_CHECK(cudaEventDestroy(a));
  CUDA_CHECK(cudaEventDestroy(b));
  CUDA_CHECK(cudaGraphExecDestroy(ge));
  CUDA_CHECK(cudaGraphDestroy(g));
  std::sort(ts.begin(), ts.end());
  return ts[ts.size() / 2];
}

}  // namespace servedeck::bench
