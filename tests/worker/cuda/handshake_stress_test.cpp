// The decode step's kernel-to-kernel handshakes (worker/cuda/handshakes.cuh) under load: while
// kernels on another stream hold random SMs for random times (stress_load.hpp), so that the
// step's blocks are placed late and out of their usual order, every decoded position's logits must
// equal, bit for bit, those of the same decode on an idle GPU; and after hundreds of graph
// replays under load (which rewrite the last KV row with the same values) the next step must
// still agree. A handshake that let a consumer read before its producer wrote, or a counter left
// at a stale value, changes logits here; one that could deadlock hangs the test (ctest's timeout).
// Two models: the backend test's small MoE (hidden 256, 16 experts) and the Qwen3-30B-A3B shape
// with two layers (128 experts, the staged down's 192 KB blocks), all through the folded router;
// the latter also with NVFP4 and FP8 experts, half of them hot (gate/up dequantising in registers
// after the folded router, then the quantised down).
#include <doctest/doctest.h>

#include <cstdio>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "tests/worker/cuda/gpu_test_support.hpp"
#include "tests/worker/cuda/stress_load.hpp"
#include "worker/cuda/cuda_backend.hpp"
#include "worker/model/checkpoint.hpp"
#include "worker/model/qwen3_30b_a3b_shape.hpp"
#include "worker/model/tiny_model.hpp"

using namespace servedeck::worker;

namespace {

// Decodes `ids` one token per forward() (each a decode step) and returns every position's
// logits; with `load`, random SM load is enqueued on `side` before every step.
std::vector<std::vector<float>> decode(gpu_test::Seq& seq, const std::vector<int32_t>& ids, cudaStream_t side, std::mt19937* load) {
  int sms = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  std::vector<std::vector<float>> rows;
  for (const int32_t t : ids) {
    if (load != nullptr) {
      std::mt19937& rng = *load;
      const int blocks = std::uniform_int_distribution<int>(1, 3 * sms)(rng);
      const int threads = 32 * std::uniform_int_distribution<int>(1, 32)(rng);
      const std::size_t smem = 1024 * static_cast<std::size_t>(std::uniform_int_distribution<int>(0, 96)(rng));
      const unsigned delay = std::uniform_int_distribution<unsigned>(0, 60000)(rng);
      const unsigned hold = std::uniform_int_distribution<unsigned>(500, 40000)(rng);
      gpu_test::launch_sm_load(side, delay, blocks, threads, smem, hold);
    }
    rows.push_back(seq.forward(std::vector<int32_t>{t}, false));
  }
  return rows;
}

void stress(const char* name, cuda::CudaBackend& be, int vocab, int n_tokens, int rounds) {
  int sms = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  std::vector<int32_t> ids;
  for (int i = 0; i < n_tokens; ++i) ids.push_back(static_cast<int32_t>((i * 7919 + 13) % vocab));
  cudaStream_t side = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking) == cudaSuccess);
  // The pool holds the idle reference's sequence and one loaded sequence per round; every
  // sequence replays the one decode graph (captured once).
  auto pool = gpu_test::make_pool(be, 2 * static_cast<std::size_t>(n_tokens + 16));
  std::vector<int32_t> with_next = ids;
  with_next.push_back(7);
  std::vector<std::vector<float>> want;
  {
    gpu_test::Seq c0(be, pool);
    want = decode(c0, with_next, side, nullptr);
  }
  std::mt19937 rng(12345);
  for (int round = 0; round < rounds; ++round) {
    CAPTURE(round);
    gpu_test::Seq c(be, pool);
    const auto got = decode(c, ids, side, &rng);
    int differ = 0;
    for (std::size_t p = 0; p < got.size(); ++p) differ += got[p] != want[p] ? 1 : 0;
    CHECK_MESSAGE(differ == 0, name, ": positions whose logits differ under load: ", differ, " of ", got.size());
    // Graph replays back to back under load, then one more step against the idle run's.
    for (int r = 0; r < 4; ++r) {
      gpu_test::launch_sm_load(side, std::uniform_int_distribution<unsigned>(0, 200000)(rng), 2 * sms, 256, 48 * 1024,
                               std::uniform_int_distribution<unsigned>(10000, 400000)(rng));
      CHECK(be.decode_step_us(50) > 0);
    }
    const auto next = decode(c, std::vector<int32_t>{7}, side, &rng);
    CHECK_MESSAGE(next[0] == want.back(), name, ": the step after 200 replays under load");
  }
  CHECK(be.graph_captures() == 1);
  REQUIRE(cudaStreamSynchronize(side) == cudaSuccess);
  cudaStreamDestroy(side);
}

}  // namespace

TEST_CASE("decode step handshakes under random SM load: logits bit-identical to an idle GPU's (small MoE)") {
  gpu_test::skip_without_gpu();
  const std::string tmpl = gpu_test::temp_dir("stress");
  write_model(tmpl, gpu_test::small_moe());
  Checkpoint ck = Checkpoint::open(tmpl);
  cuda::CudaBackendOptions opt;
  opt.hot_fraction = 0.5;
  opt.staged_prefill = false;
  auto be = cuda::make_cuda_backend(ck, opt);
  stress("small MoE", *be, 4096, 48, 6);
  std::filesystem::remove_all(tmpl);
}

TEST_CASE("decode step handshakes under random SM load: logits bit-identical to an idle GPU's (Qwen3-30B-A3B shape, 2 layers)") {
  gpu_test::skip_without_gpu();
  const ModelDescription d = qwen3_30b_a3b_shape(2);
  cuda::CudaBackendOptions opt;
  opt.hot_slots = 128;
  opt.staged_prefill = false;
  auto be = cuda::make_synthetic_cuda_backend(d, 1, opt);
  stress("Qwen3-30B-A3B shape", *be, 151936, 32, 4);
}

TEST_CASE("decode step handshakes under random SM load: NVFP4 and FP8 experts, half hot (Qwen3-30B-A3B shape, 2 layers)") {
  gpu_test::skip_without_gpu();
  const ModelDescription d = qwen3_30b_a3b_shape(2);
  for (const auto f : {cuda::ExpertFormat::nvfp4, cuda::ExpertFormat::fp8_block}) {
    CAPTURE(static_cast<int>(f));
    cuda::CudaBackendOptions opt;
    opt.hot_slots = 64;  // half of each layer's experts in VRAM, the rest read over UVA
    opt.staged_prefill = false;
    auto be = cuda::make_synthetic_cuda_backend(d, 1, opt, f);
    stress(f == cuda::ExpertFormat::nvfp4 ? "Qwen3-30B-A3B shape, nvfp4" : "Qwen3-30B-A3B shape, fp8", *be, 151936, 32, 3);
  }
}
