// The machine's ceilings the CUDA benchmarks' rooflines use, measured in the benchmark's own
// run: the pinned host→device copy, zero-copy UVA reads and HBM reads by the worker's GEMV
// kernel (launch_gemv_bf16) over 2 GiB.
#pragma once

namespace servedeck::bench {

struct Ceilings {
  double h2d_gbs, uva_gbs, hbm_gbs;  // GB/s
};

/// Measures the three ceilings (medians of 5, 5 and 20 timed runs, CUDA events).
Ceilings measure_ceilings();

}  // namespace servedeck::bench
