#include "bench/moe_offload/decode_trace_report.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <vector>

#include <cuda_runtime.h>

#include "worker/cuda/cuda_check.hpp"
#include "worker/cuda/decode_trace.hpp"

namespace servedeck::bench {

#ifndef SERVEDECK_DECODE_TRACE
void decode_trace_report(worker::cuda::CudaBackend&) { std::printf("\ntrace: not built (-DSERVEDECK_DECODE_TRACE=ON)\n"); }
#else
namespace {
struct Grid {
  unsigned long long id = 0;
  int blocks = 0;
  unsigned long long first_start = ~0ull, first_wait = ~0ull, first_waited = ~0ull, last_waited = 0, last_end = 0;
  unsigned long long first_staged = ~0ull, last_staged = 0;  // staging kernels only
  unsigned long long first_summed = ~0ull, last_summed = 0;  // staging kernels only
  // Every block's marks (0: none recorded), for the spread of one layer's blocks (percentiles).
  std::vector<unsigned long long> starts, waited, staged, ends;
};

// The q-th quantile (0..1) of the nonzero values in v, relative to t0 in us; NaN when none.
double quantile_us(std::vector<unsigned long long> v, double q, unsigned long long t0) {
  std::erase(v, 0ull);
  if (v.empty()) return std::nan("");
  std::sort(v.begin(), v.end());
  const std::size_t i = std::min(v.size() - 1, static_cast<std::size_t>(q * static_cast<double>(v.size() - 1) + 0.5));
  return (static_cast<double>(v[i]) - static_cast<double>(t0)) / 1000.0;
}
}  // namespace

void decode_trace_report(worker::cuda::CudaBackend& backend) {
  namespace cuda = worker::cuda;
  const std::size_t n = cuda::k_decode_trace_slots;
  cuda::DecodeTraceRecord* dev = nullptr;
  CUDA_CHECK(cudaMalloc(&dev, n * sizeof(cuda::DecodeTraceRecord)));
  CUDA_CHECK(cudaMemset(dev, 0, n * sizeof(cuda::DecodeTraceRecord)));
  cuda::set_decode_trace_buffer(dev);
  backend.decode_step_us(1);  // 6 replays; the slots keep the last one's records
  CUDA_CHECK(cudaDeviceSynchronize());
  cuda::set_decode_trace_buffer(nullptr);
  std::vector<cuda::DecodeTraceRecord> rec(n);
  CUDA_CHECK(cudaMemcpy(rec.data(), dev, n * sizeof(cuda::DecodeTraceRecord), cudaMemcpyDeviceToHost));
  CUDA_CHECK(cudaFree(dev));
  std::map<unsigned long long, Grid> grids;
  for (const auto& r : rec) {
    if (r.t_end == 0) continue;
    Grid& g = grids[r.grid];
    g.id = r.grid;
    ++g.blocks;
    g.first_start = std::min(g.first_start, r.t_start);
    g.starts.push_back(r.t_start);
    g.ends.push_back(r.t_end);
    // Only a wait inside the block's own lifetime: a block that returns without waiting (the
    // early routing's router, all but its last block) keeps an older record's marks in its slot.
    if (r.t_wait != 0 && r.t_wait >= r.t_start && r.t_waited <= r.t_end) {
      g.first_wait = std::min(g.first_wait, r.t_wait);
      g.first_waited = std::min(g.first_waited, r.t_waited);
      g.last_waited = std::max(g.last_waited, r.t_waited);
      g.waited.push_back(r.t_waited);
    }
    g.last_end = std::max(g.last_end, r.t_end);
    // A slot reused by a grid that does not stage keeps an older record's t_staged: only a mark
    // inside the block's own lifetime counts.
    if (r.t_staged != 0 && r.t_staged >= r.t_start && r.t_staged <= r.t_end) {
      g.first_staged = std::min(g.first_staged, r.t_staged);
      g.last_staged = std::max(g.last_staged, r.t_staged);
      g.staged.push_back(r.t_staged);
    }
    if (r.t_summed != 0 && r.t_summed >= r.t_start && r.t_summed <= r.t_end) {
      g.first_summed = std::min(g.first_summed, r.t_summed);
      g.last_summed = std::max(g.last_summed, r.t_summed);
    }
  }
  // The last replay's grids: the latest started (one step = 6 per MoE layer + lm_head).
  std::vector<Grid> all;
  for (const auto& [id, g] : grids) all.push_back(g);
  std::sort(all.begin(), all.end(), [](const Grid& a, const Grid& b) { return a.first_start < b.first_start; });
  const auto& d = backend.description();
  // Six traced kernels per layer: the table below names them by their place in a MoE layer.
  for (const auto& layer : d.layers)
    if (layer.mlp != worker::MlpKind::moe) {
      std::printf("\ntrace: the per-layer table needs a model whose layers are all MoE (layer kinds differ here)\n");
      return;
    }
  const std::size_t per_step = 6 * d.layers.size() + 1;
  std::printf("\ndecode step timeline (trace build: %%globaltimer per block; one replay, %zu grids recorded, %zu per step)\n", all.size(),
              per_step);
  if (all.size() < per_step) {
    std::printf("trace: too few grids recorded\n");
    return;
  }
  std::vector<Grid> step(all.end() - static_cast<std::ptrdiff_t>(per_step), all.end());
  // Timer granularity: the smallest positive gap between distinct start times.
  std::vector<unsigned long long> ts;
  for (const auto& g : step) ts.push_back(g.first_start);
  std::sort(ts.begin(), ts.end());
  unsigned long long gran = ~0ull;
  for (std::size_t i = 1; i < ts.size(); ++i)
    if (ts[i] > ts[i - 1]) gran = std::min(gran, ts[i] - ts[i - 1]);
  std::printf("globaltimer: smallest gap between grid starts %llu ns; step first start -> lm_head end %.2f us\n", gran,
              (step.back().last_end - step.front().first_start) / 1000.0);
  // The SM clock while the step ran: every recorded block's %clock64 cycles over its globaltimer
  // ns, summed over the blocks of the step's grids (blocks shorter than 1 us are left out: the
  // timer's granularity would dominate them).
  double cycles = 0, ns = 0;
  for (const auto& r : rec) {
    if (r.t_end == 0 || r.c_end <= r.c_start || r.t_end < r.t_start + 1000) continue;
    if (r.t_start < step.front().first_start || r.t_end > step.back().last_end) continue;
    cycles += static_cast<double>(r.c_end - r.c_start);
    ns += static_cast<double>(r.t_end - r.t_start);
  }
  if (ns > 0) std::printf("SM clock while the step ran: %.0f MHz (%%clock64 cycles / %%globaltimer ns over its blocks)\n", 1000.0 * cycles / ns);
  const char* names[6] = {"norm+qkv", "attention", "o-proj", "router", "gate_up", "down"};
  const int L = static_cast<int>(d.layers.size()), lo = std::min(8, L / 4), hi = std::max(lo + 1, L - 8);
  std::printf("%-10s %7s %9s %9s %9s %9s %9s %9s   (means over layers %d..%d, us; sums: last staged -> last summed, fin: -> last end)\n",
              "kernel", "blocks", "span", "lead", "late", "tail", "sums", "fin", lo, hi - 1);
  double layer_sum = 0;
  // A grid whose blocks never pass a PDL wait (the early routing's router waits on H2's count
  // instead) has no span of its own: its predecessor's runs to the next grid that waits.
  auto waits = [](const Grid& g) { return g.last_waited != 0; };
  for (int k = 0; k < 6; ++k) {
    double span = 0, lead = 0, late = 0, tail = 0, blocks = 0, sums = 0, fin = 0;
    bool timed = true;
    for (int l = lo; l < hi; ++l) {
      const std::size_t i = static_cast<std::size_t>(6 * l + k);
      const Grid& g = step[i];
      std::size_t j = i + 1;
      while (j + 1 < step.size() && !waits(step[j])) ++j;
      const Grid& next = step[j];
      blocks += g.blocks;
      if (!waits(g)) {
        timed = false;
        continue;
      }
      // This kernel ends when its successor's first wait returns; its predecessor ends when its own does.
      span += (static_cast<double>(next.first_waited) - static_cast<double>(g.first_waited)) / 1000.0;
      lead += (static_cast<double>(g.first_waited) - static_cast<double>(g.first_wait)) / 1000.0;
      late += (static_cast<double>(g.last_waited) - static_cast<double>(g.first_waited)) / 1000.0;
      tail += (static_cast<double>(g.last_end) - static_cast<double>(next.first_waited)) / 1000.0;
      if (g.last_summed != 0 && g.last_staged != 0) {
        sums += (static_cast<double>(g.last_summed) - static_cast<double>(g.last_staged)) / 1000.0;
        fin += (static_cast<double>(g.last_end) - static_cast<double>(g.last_summed)) / 1000.0;
      }
    }
    const double m = hi - lo;
    if (!timed) {
      std::printf("%-10s %7.0f %9s %9s %9s %9s %9s %9s\n", names[k], blocks / m, "-", "-", "-", "-", "-", "-");
      continue;
    }
    layer_sum += span / m;
    std::printf("%-10s %7.0f %9.2f %9.2f %9.2f %9.2f %9.2f %9.2f\n", names[k], blocks / m, span / m, lead / m, late / m, tail / m, sums / m,
                fin / m);
  }
  std::printf("layer (sum of spans) %.2f us\n", layer_sum);
  // One layer in full, relative to its qkv's first wait return, for reading by eye.
  const int l = L / 2;
  const unsigned long long t0 = step[static_cast<std::size_t>(6 * l)].first_waited;
  std::printf("layer %d in full (us from its qkv's first wait return): kernel: first start / first wait / first waited / last waited / last end"
              " [/ first staged / last staged: rows all in shared memory / first summed / last summed: partial sums done]\n", l);
  auto rel = [&](unsigned long long t) { return (static_cast<double>(t) - static_cast<double>(t0)) / 1000.0; };
  for (int k = 0; k < 7; ++k) {
    const Grid& g = step[static_cast<std::size_t>(6 * l + k)];
    if (waits(g))
      std::printf("  %-10s %8.2f %8.2f %8.2f %8.2f %8.2f", k < 6 ? names[k] : "next qkv", rel(g.first_start), rel(g.first_wait),
                  rel(g.first_waited), rel(g.last_waited), rel(g.last_end));
    else
      std::printf("  %-10s %8.2f %8s %8s %8s %8.2f", k < 6 ? names[k] : "next qkv", rel(g.first_start), "-", "-", "-", rel(g.last_end));
    // The row-kernel down records its sums but stages nothing: dashes keep the columns apart.
    if (g.last_staged != 0) std::printf(" %8.2f %8.2f", rel(g.first_staged), rel(g.last_staged));
    else if (g.last_summed != 0) std::printf(" %8s %8s", "-", "-");
    if (g.last_summed != 0) std::printf(" %8.2f %8.2f", rel(g.first_summed), rel(g.last_summed));
    std::printf("\n");
  }
  // The same layer's blocks spread out: when the median and the slowest tenth of its blocks
  // started, came through the wait, staged (or saw the ids) and ended.
  std::printf("layer %d, blocks' quantiles p10 / p50 / p90 (us, same origin): start | waited | staged | end\n", l);
  for (int k = 0; k < 7; ++k) {
    const Grid& g = step[static_cast<std::size_t>(6 * l + k)];
    std::printf("  %-10s", k < 6 ? names[k] : "next qkv");
    for (const auto* v : {&g.starts, &g.waited, &g.staged, &g.ends})
      std::printf(" | %6.2f %6.2f %6.2f", quantile_us(*v, 0.1, t0), quantile_us(*v, 0.5, t0), quantile_us(*v, 0.9, t0));
    std::printf("\n");
  }
}
#endif

}  // namespace servedeck::bench
