#include "worker/cpu/logit_compare.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

namespace servedeck::worker::cpu {

namespace {

std::size_t argmax(const float* row, std::size_t n) {
  std::size_t best = 0;
  for (std::size_t i = 1; i < n; ++i)
    if (row[i] > row[best]) best = i;
  return best;
}

/// log softmax of row into out (double).
void log_softmax(const float* row, std::size_t n, std::vector<double>& out) {
  const double mx = *std::max_element(row, row + n);
  double s = 0;
  for (std::size_t i = 0; i < n; ++i) s += std::exp(static_cast<double>(row[i]) - mx);
  const double lse = mx + std::log(s);
  out.resize(n);
  for (std::size_t i = 0; i < n; ++i) out[i] = static_cast<double>(row[i]) - lse;
}

}  // namespace

LogitComparison compare_logits(std::span<const float> ref, std::span<const float> got, std::size_t vocab) {
  LogitComparison c;
  c.positions = ref.size() / vocab;
  double num = 0, den = 0, kl = 0;
  std::size_t agree = 0;
  std::vector<double> lr, lg;
  for (std::size_t p = 0; p < c.positions; ++p) {
    const float* r = ref.data() + p * vocab;
    const float* g = got.data() + p * vocab;
    for (std::size_t i = 0; i < vocab; ++i) {
      const double d = static_cast<double>(g[i]) - r[i];
      num += d * d;
      den += static_cast<double>(r[i]) * r[i];
      c.max_abs = std::max(c.max_abs, std::fabs(d));
    }
    agree += argmax(r, vocab) == argmax(g, vocab);
    log_softmax(r, vocab, lr);
    log_softmax(g, vocab, lg);
    double k = 0;
    for (std::size_t i = 0; i < vocab; ++i) k += std::exp(lr[i]) * (lr[i] - lg[i]);
    kl += k;
  }
  c.rel_l2 = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  c.top1_agreement = c.positions ? static_cast<double>(agree) / static_cast<double>(c.positions) : 0;
  c.mean_kl = c.positions ? kl / static_cast<double>(c.positions) : 0;
  return c;
}

}  // namespace servedeck::worker::cpu
