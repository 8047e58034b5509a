#include "worker/cpu/dequantized_weights.hpp"

#include "worker/cpu/ops.hpp"

namespace servedeck::worker::cpu {

DequantizedWeights::DequantizedWeights(const Checkpoint& checkpoint, std::size_t threads)
    : layers_(checkpoint.layers()), lm_head_(checkpoint.lm_head()) {
  for (auto& L : layers_) for_each_linear(L, [&](WeightRef& w) { dequantize(w, threads); });
  dequantize(lm_head_, threads);
}

void DequantizedWeights::dequantize(WeightRef& w, std::size_t threads) {
  if (!w.quant) return;
  const QuantizedWeight& q = *w.quant;
  auto o = std::make_unique<Owned>();
  o->info.name = q.module + ".weight";
  o->info.dtype = Dtype::f32;
  o->info.shape = {q.rows, q.cols};
  o->data.resize(static_cast<std::size_t>(q.rows * q.cols));
  o->info.end = o->data.size() * sizeof(float);
  const auto rows = static_cast<std::size_t>(q.rows), cols = static_cast<std::size_t>(q.cols);
  parallel_for(rows, threads, rows * cols, [&](std::size_t b, std::size_t e) {
    dequantize_rows(q, static_cast<std::int64_t>(b), static_cast<std::int64_t>(e - b), o->data.data() + b * cols);
  });
  w.info = &o->info;
  w.bytes = {reinterpret_cast<const std::byte*>(o->data.data()), o->info.end};
  w.quant = nullptr;
  owned_.push_back(std::move(o));
}

std::size_t DequantizedWeights::dequantized_bytes() const {
  std::size_t n = 0;
  for (const auto& o : owned_) n += o->data.size() * sizeof(float);
  return n;
}

}  // namespace servedeck::worker::cpu
