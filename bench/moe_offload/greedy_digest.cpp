// greedy_digest: the decode path's output as digests, for comparing two builds bit for bit (the
// same-run A/B of docs/cuda-backend.md, "Measuring"). Two models: the backend test's small MoE
// checkpoint (written to a temporary directory from its fixed seed; half the experts in VRAM,
// half over UVA) and the Qwen3-30B-A3B shape with 4 layers, weights synthesised from seed 1, all
// experts resident. For each: the logits of every prompt position through the decode step
// (forward, token by token) as one FNV-1a 64 digest of their bytes, then the greedy tokens of
// forward_greedy. Prints one line per model; exits 77 without a CUDA device.
// Usage: greedy_digest [--tokens N]
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "worker/cuda/cuda_backend.hpp"
#include "worker/engine/kv_sequence.hpp"
#include "worker/engine/sampler.hpp"
#include "worker/model/checkpoint.hpp"
#include "worker/model/qwen3_30b_a3b_shape.hpp"
#include "worker/model/tiny_model.hpp"

using namespace servedeck::worker;

namespace {

uint64_t fnv1a(const std::vector<float>& v) {
  uint64_t h = 1469598103934665603ull;
  const auto* p = reinterpret_cast<const unsigned char*>(v.data());
  for (std::size_t i = 0; i < v.size() * sizeof(float); ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

void run(const char* name, cuda::CudaBackend& be, int vocab, int prompt, int tokens) {
  std::vector<int32_t> ids;
  for (int i = 0; i < prompt; ++i) ids.push_back(static_cast<int32_t>((i * 7919 + 13) % vocab));
  KvBlockPool pool({static_cast<std::size_t>(prompt + tokens + 8 + 15) / 16, 16});
  be.allocate_kv_pool(pool.shape());
  KvSequence seq(pool, false);
  const std::vector<float> logits = forward_sequence(be, seq, ids, true);
  int32_t next = argmax(std::vector<float>(logits.end() - vocab, logits.end()));
  std::printf("%s: prompt %d, logits digest %016llx, greedy", name, prompt, static_cast<unsigned long long>(fnv1a(logits)));
  for (int i = 0; i < tokens; ++i) {
    seq.reserve(seq.length() + 1);
    const int32_t in[1] = {next};
    next = be.forward_greedy(seq.view(), next);
    seq.append(in);
    std::printf(" %d", next);
  }
  std::printf("\n");
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  int tokens = 24;
  for (int i = 1; i + 1 < argc; i += 2)
    if (std::strcmp(argv[i], "--tokens") == 0) tokens = std::atoi(argv[i + 1]);
  if (!cuda::cuda_device_available()) {
    std::printf("no CUDA device\n");
    return 77;
  }
  {
    char tmpl[] = "/tmp/servedeck-digest-XXXXXX";
    if (mkdtemp(tmpl) == nullptr) return 1;
    TinyModelOptions o;  // the backend test's small_moe()
    o.num_layers = 3;
    o.hidden_size = 256;
    o.num_heads = 8;
    o.num_kv_heads = 2;
    o.head_dim = 32;
    o.num_experts = 16;
    o.top_k = 4;
    o.moe_intermediate_size = 64;
    o.vocab_size = 4096;
    write_model(tmpl, o);
    Checkpoint ck = Checkpoint::open(tmpl);
    cuda::CudaBackendOptions opt;
    opt.hot_fraction = 0.5;
    opt.staged_prefill = false;  // every position through the decode step
    auto be = cuda::make_cuda_backend(ck, opt);
    run("small MoE (test shape)", *be, 4096, 40, tokens);
    std::filesystem::remove_all(tmpl);
  }
  {
    const ModelDescription d = qwen3_30b_a3b_shape(4);
    cuda::CudaBackendOptions opt;
    opt.hot_slots = 128;
    opt.staged_prefill = false;
    auto be = cuda::make_synthetic_cuda_backend(d, 1, opt);
    run("Qwen3-30B-A3B shape, 4 layers, resident", *be, 151936, 16, tokens);
  }
  return 0;
}
