// Helpers for GPU-labelled tests: skip without a device, device buffers, and a mismatch
// report that prints the first differences with index, expected and got.
#pragma once

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <doctest/doctest.h>
#include <unistd.h>

#include "worker/cuda/cuda_backend.hpp"
#include "worker/cuda/cuda_check.hpp"
#include "worker/engine/kv_sequence.hpp"
#include "worker/model/tiny_model.hpp"

namespace gpu_test {

/// The MoE shape most CUDA tests use: 3 layers, hidden 256, 8/2 heads of 32, 16 experts top-4 of
/// 64, vocab 4096 (small enough for the CPU reference, large enough for several GEMV blocks).
inline servedeck::worker::TinyModelOptions small_moe() {
  servedeck::worker::TinyModelOptions o;
  o.num_layers = 3;
  o.hidden_size = 256;
  o.num_heads = 8;
  o.num_kv_heads = 2;
  o.head_dim = 32;
  o.num_experts = 16;
  o.top_k = 4;
  o.moe_intermediate_size = 64;
  o.vocab_size = 4096;
  return o;
}

/// A new directory /tmp/servedeck-cuda-`tag`-XXXXXX (mkdtemp); the test fails when it cannot be made.
inline std::string temp_dir(const std::string& tag) {
  std::string tmpl = "/tmp/servedeck-cuda-" + tag + "-XXXXXX";
  REQUIRE(mkdtemp(tmpl.data()) != nullptr);
  return tmpl;
}

inline void skip_without_gpu() {
  if (!servedeck::worker::cuda::cuda_device_available()) {
    std::printf("no CUDA device: GPU test skipped\n");
    std::exit(77);
  }
}

template <class T>
struct DeviceBuffer {
  T* ptr = nullptr;
  std::size_t n = 0;
  explicit DeviceBuffer(std::size_t count) : n(count) { CUDA_CHECK(cudaMalloc(&ptr, count * sizeof(T))); }
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size()) {
    CUDA_CHECK(cudaMemcpy(ptr, host.data(), n * sizeof(T), cudaMemcpyHostToDevice));
  }
  ~DeviceBuffer() { cudaFree(ptr); }
  std::vector<T> get() const {
    std::vector<T> h(n);
    CUDA_CHECK(cudaDeviceSynchronize());
    CUDA_CHECK(cudaMemcpy(h.data(), ptr, n * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
  }
  /// Fills with a NaN pattern so an unwritten element cannot pass.
  void poison() { CUDA_CHECK(cudaMemset(ptr, 0xff, n * sizeof(T))); }
};

inline std::vector<float> random_floats(std::size_t n, unsigned seed, float scale = 1.f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-scale, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

inline std::vector<__nv_bfloat16> to_bf16(const std::vector<float>& v) {
  std::vector<__nv_bfloat16> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) out[i] = __float2bfloat16(v[i]);
  return out;
}

inline std::vector<float> from_bf16(const std::vector<__nv_bfloat16>& v) {
  std::vector<float> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) out[i] = __bfloat162float(v[i]);
  return out;
}

/// Relative L2 error ‖got − want‖ / ‖want‖; prints the first `show` elements beyond `abs_tol`.
inline double compare(const std::vector<float>& want, const std::vector<float>& got, const char* what,
                      double abs_tol = 1e-3, int show = 5) {
  double num = 0, den = 0;
  int shown = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    const double d = static_cast<double>(got[i]) - want[i];
    if (std::isnan(got[i])) num += 1e30;
    num += d * d;
    den += static_cast<double>(want[i]) * want[i];
    if ((std::isnan(got[i]) || std::fabs(d) > abs_tol) && shown < show) {
      std::printf("%s: index %zu expected %.6g got %.6g\n", what, i, want[i], got[i]);
      ++shown;
    }
  }
  return std::sqrt(num / (den > 0 ? den : 1));
}

/// A KV pool of at least `tokens` positions in blocks of `block_tokens`, allocated in `backend`
/// (replacing its earlier pool): the bookkeeping of the sequences a test runs in it.
inline servedeck::worker::KvBlockPool make_pool(servedeck::worker::Backend& backend, std::size_t tokens, std::size_t block_tokens = 16) {
  servedeck::worker::KvBlockPool pool({(tokens + block_tokens - 1) / block_tokens, block_tokens});
  backend.allocate_kv_pool(pool.shape());
  return pool;
}

/// One sequence in a pool, driven directly (the engine's steps: reserve, forward, append).
/// `cache`: prefix caching (attach_prefix finds and append publishes full blocks).
struct Seq {
  Seq(servedeck::worker::Backend& backend, servedeck::worker::KvBlockPool& pool, bool cache = false) : be(backend), seq(pool, cache) {}
  std::vector<float> forward(std::span<const int32_t> tokens, bool all_logits) {
    return servedeck::worker::forward_sequence(be, seq, tokens, all_logits);
  }
  std::vector<float> forward(const std::vector<int32_t>& tokens, bool all_logits) {
    return forward(std::span<const int32_t>(tokens), all_logits);
  }
  /// forward_greedy at the next position; KvCacheFull when the pool has no room.
  int32_t greedy(int32_t token) {
    if (!seq.reserve(seq.length() + 1)) throw servedeck::worker::KvCacheFull("test pool full");
    const int32_t picked = be.forward_greedy(seq.view(), token);
    const int32_t one[1] = {token};
    seq.append(one);
    return picked;
  }
  std::size_t length() const { return seq.length(); }
  servedeck::worker::Backend& be;
  servedeck::worker::KvSequence seq;
};

}  // namespace gpu_test
