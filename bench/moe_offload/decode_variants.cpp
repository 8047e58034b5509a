// bench_moe_offload --variants: the decode step's A/B switches on one loaded model (see
// decode_variants.hpp).
#include "bench/moe_offload/decode_variants.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "worker/engine/sampler.hpp"

namespace servedeck::bench {

namespace {

namespace cuda = servedeck::worker::cuda;
using clk = std::chrono::steady_clock;

// Splits s at `sep` (empty pieces dropped).
std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::size_t at = 0;
  while (at <= s.size()) {
    const std::size_t end = std::min(s.find(sep, at), s.size());
    if (end > at) out.push_back(s.substr(at, end - at));
    at = end + 1;
  }
  return out;
}

}  // namespace

// --variants: all experts resident; per variant (the baseline first and last) the variables are
// set, a new cache (so a new decode graph) runs the prompt and `decode` tokens, and the row
// gives tok/s and the graph alone (decode_step_us, 32 replays at the last position).
int run_decode_variants(cuda::CudaBackend& backend, const std::string& spec, int prompt, int decode) {
  backend.set_hot_slots(128);
  backend.set_use_pdl(true);
  std::vector<std::string> sets = split(spec, ';');
  sets.insert(sets.begin(), "");
  sets.push_back("");
  std::vector<std::string> names;
  for (const std::string& set : sets)
    for (const std::string& kv : split(set, ','))
      if (kv.find('=') != std::string::npos) names.push_back(kv.substr(0, kv.find('=')));
  std::printf("\ndecode variants, all experts resident, %d-token prompt, %d new tokens\n%-60s %10s %10s\n", prompt, decode, "variant",
              "tok/s", "GPU ms");
  for (const std::string& set : sets) {
    for (const std::string& n : names) unsetenv(n.c_str());
    for (const std::string& kv : split(set, ','))
      if (const std::size_t eq = kv.find('='); eq != std::string::npos) setenv(kv.substr(0, eq).c_str(), kv.substr(eq + 1).c_str(), 1);
    auto cache = backend.new_cache(static_cast<std::size_t>(prompt + decode + 8));
    std::vector<int32_t> ids;
    for (int i = 0; i < prompt; ++i) ids.push_back((i * 7919 + 11) % 151643);
    auto logits = backend.forward(*cache, ids, false);
    const auto td = clk::now();
    int32_t next = servedeck::worker::argmax(logits);  // then the engine's greedy path (forward_greedy)
    for (int i = 0; i < decode; ++i) next = backend.forward_greedy(*cache, next);
    const double decode_s = std::chrono::duration<double>(clk::now() - td).count();
    const double step_us = backend.decode_step_us(*cache, 32);
    std::printf("%-60s %10.2f %10.3f\n", set.empty() ? "baseline" : set.c_str(), decode / decode_s, step_us / 1000);
  }
  for (const std::string& n : names) unsetenv(n.c_str());
  return 0;
}

}  // namespace servedeck::bench
