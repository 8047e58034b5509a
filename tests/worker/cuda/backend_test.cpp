// The CUDA backend against the CPU reference backend on random-initialised checkpoints, and
// offload on vs off on the same checkpoint.
// Tolerances (stated): CUDA vs CPU — both fp32 arithmetic on the same bf16 weights, differing
// only in summation order — max |Δlogit| < 2e-3 and identical top-1 at every position.
// Offload on vs off — the same kernels read the same bytes from host or VRAM: bit-identical.
#include <doctest/doctest.h>

#include <unistd.h>

#include <algorithm>
#include <filesystem>

#include "tests/worker/cuda/gpu_test_support.hpp"
#include "worker/cpu/cpu_backend.hpp"
#include "worker/cuda/cuda_backend.hpp"
#include "worker/model/checkpoint.hpp"
#include "worker/model/tiny_model.hpp"

using namespace servedeck::worker;

namespace {

std::string temp_dir() {
  char tmpl[] = "/tmp/servedeck-cuda-test-XXXXXX";
  REQUIRE(mkdtemp(tmpl) != nullptr);
  return tmpl;
}

std::vector<int32_t> prompt(std::size_t n, std::size_t vocab) {
  std::vector<int32_t> ids;
  for (std::size_t i = 0; i < n; ++i) ids.push_back(static_cast<int32_t>((i * 7919 + 13) % vocab));
  return ids;
}

std::size_t argmax(const float* row, std::size_t n) { return static_cast<std::size_t>(std::max_element(row, row + n) - row); }

}  // namespace

TEST_CASE("CUDA backend matches the CPU backend (logits at every position) on a MoE checkpoint") {
  gpu_test::skip_without_gpu();
  const std::string dir = temp_dir();
  TinyModelOptions o;
  o.num_layers = 3;
  o.hidden_size = 256;
  o.num_heads = 8;
  o.num_kv_heads = 2;
  o.head_dim = 32;
  o.num_experts = 16;
  o.top_k = 4;
  o.moe_intermediate_size = 64;
  o.vocab_size = 4096;
  write_model(dir, o);
  Checkpoint ck = Checkpoint::open(dir);
  auto cpu = make_cpu_backend(ck);
  cuda::CudaBackendOptions opt;
  opt.hot_fraction = 0.5;  // half the experts of each layer in VRAM, half read over UVA
  auto gpu = cuda::make_cuda_backend(ck, opt);
  const auto ids = prompt(40, 4096);
  auto c1 = cpu->new_cache(64);
  auto c2 = gpu->new_cache(64);
  auto want = cpu->forward(*c1, ids, true);
  auto got = gpu->forward(*c2, ids, true);
  REQUIRE(want.size() == got.size());
  double max_abs = 0;
  int top1_same = 0;
  for (std::size_t p = 0; p < ids.size(); ++p) {
    const float* a = want.data() + p * 4096;
    const float* b = got.data() + p * 4096;
    for (std::size_t i = 0; i < 4096; ++i) max_abs = std::max(max_abs, static_cast<double>(std::fabs(a[i] - b[i])));
    top1_same += argmax(a, 4096) == argmax(b, 4096);
  }
  MESSAGE("CUDA vs CPU: max |dlogit| = " << max_abs << ", top-1 agreement " << top1_same << "/" << ids.size());
  CHECK(max_abs < 2e-3);
  CHECK(top1_same == static_cast<int>(ids.size()));
  // Incremental decode continues the same sequence.
  auto w1 = cpu->forward(*c1, std::vector<int32_t>{17}, false);
  auto g1 = gpu->forward(*c2, std::vector<int32_t>{17}, false);
  CHECK(argmax(w1.data(), 4096) == argmax(g1.data(), 4096));
  auto stats = gpu->stats();
  CHECK(stats.hot_hits > 0);
  CHECK(stats.misses > 0);
  std::filesystem::remove_all(dir);
}

TEST_CASE("offload on vs off gives bit-identical logits; KV cap refused with both numbers") {
  gpu_test::skip_without_gpu();
  const std::string dir = temp_dir();
  TinyModelOptions o;
  o.vocab_size = 2048;
  o.hidden_size = 128;
  o.num_experts = 8;
  o.top_k = 2;
  write_model(dir, o);
  Checkpoint ck = Checkpoint::open(dir);
  cuda::CudaBackendOptions resident, offloaded;
  resident.hot_fraction = 1.0;
  offloaded.hot_fraction = 0.0;
  auto a = cuda::make_cuda_backend(ck, resident);
  auto b = cuda::make_cuda_backend(ck, offloaded);
  const auto ids = prompt(24, 2048);
  auto ca = a->new_cache(32), cb = b->new_cache(32);
  auto la = a->forward(*ca, ids, true);
  auto lb = b->forward(*cb, ids, true);
  CHECK(la == lb);
  CHECK(b->stats().hot_hits == 0);
  CHECK(a->stats().misses == 0);
  CHECK_THROWS_WITH_AS(b->forward(*cb, prompt(9, 2048), false),
                       "KV cache full: 24 cached + 9 new tokens exceed the capacity of 32 tokens", KvCacheFull);
  std::filesystem::remove_all(dir);
}
