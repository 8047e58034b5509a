// servedeck-quant-error: the quantisation error of a checkpoint against its original, both run
// on the CPU backend (fp32 forward, fp32 K/V) over the same prompt.
// Usage: servedeck-quant-error REFERENCE_DIR QUANTISED_DIR [--tokens N] [--seed S] [--threads N]
//   The prompt is N token ids (default 64) drawn from a splitmix64 stream seeded with S (default
//   0) over the vocabulary; every position's logits are compared (worker/cpu/logit_compare.hpp).
// Prints one JSON object: {"reference", "quantised", "format", "positions", "rel_l2", "max_abs",
// "top1_agreement", "mean_kl"}. Exit status 0, or 1 with a message on stderr.
#include <cstdint>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "worker/cpu/cpu_backend.hpp"
#include "worker/cpu/logit_compare.hpp"
#include "worker/engine/kv_sequence.hpp"
#include "worker/model/checkpoint.hpp"

namespace {

using namespace servedeck::worker;

std::vector<float> all_logits(const Checkpoint& ck, const std::vector<int32_t>& tokens, std::size_t threads) {
  auto backend = make_cpu_backend(ck, CpuBackendOptions{threads, KvDtype::f32});
  KvBlockPool pool({(tokens.size() + 15) / 16, 16});
  backend->allocate_kv_pool(pool.shape());
  KvSequence seq(pool, false);
  return forward_sequence(*backend, seq, tokens, true);
}

int run(int argc, char** argv) {
  if (argc < 3) {
    std::cerr << "usage: servedeck-quant-error REFERENCE_DIR QUANTISED_DIR [--tokens N] [--seed S] [--threads N]\n";
    return 1;
  }
  std::size_t n = 64, threads = 0;
  std::uint64_t seed = 0;
  for (int i = 3; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--tokens") n = std::stoul(argv[i + 1]);
    else if (a == "--seed") seed = std::stoull(argv[i + 1]);
    else if (a == "--threads") threads = std::stoul(argv[i + 1]);
    else throw std::runtime_error("unknown flag " + a);
  }
  const Checkpoint ref = Checkpoint::open(argv[1]);
  const Checkpoint quant = Checkpoint::open(argv[2]);
  const auto vocab = static_cast<std::uint64_t>(ref.description().vocab_size);
  if (quant.description().vocab_size != ref.description().vocab_size)
    throw std::runtime_error("vocabularies differ: " + std::to_string(vocab) + " and " +
                             std::to_string(quant.description().vocab_size));
  std::vector<int32_t> tokens(n);
  std::uint64_t s = seed;
  for (auto& t : tokens) {
    std::uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    t = static_cast<int32_t>((z ^ (z >> 31)) % vocab);
  }
  const auto a = all_logits(ref, tokens, threads);
  const auto b = all_logits(quant, tokens, threads);
  const auto c = cpu::compare_logits(a, b, vocab);
  const nlohmann::json out = {{"reference", argv[1]},         {"quantised", argv[2]},
                              {"format", to_string(quant.quantization().format)},
                              {"positions", c.positions},     {"rel_l2", c.rel_l2},
                              {"max_abs", c.max_abs},         {"top1_agreement", c.top1_agreement},
                              {"mean_kl", c.mean_kl}};
  std::cout << out.dump() << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "servedeck-quant-error: " << e.what() << "\n";
    return 1;
  }
}
