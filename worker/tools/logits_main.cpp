// servedeck-logits: runs the CPU backend over token-id prompts and writes per-position logits,
// for comparison against a reference implementation (scripts/compare_transformers.py).
//
// Usage: servedeck-logits CHECKPOINT_DIR PROMPTS.json OUT.json [--full-logits OUT.f32]
//                         [--top-k K] [--threads N] [--incremental] [--kv-dtype f32|bf16]
//   PROMPTS.json  a JSON array of prompts, each an array of token ids: [[151644, 872, ...], ...]
//   OUT.json      {"vocab_size": V, "prompts": [{"tokens": [...], "positions": [
//                   {"logsumexp": x, "top": [[id, logit], ...]}, ...]}, ...]}
//   --full-logits raw little-endian fp32, all prompts' positions in order, V floats each
//   --incremental prefill one token at a time through the KV cache instead of one forward pass
//   --kv-dtype    the stored K/V's type (CpuBackendOptions::kv_dtype): f32 (default here, the
//                 fp32 reference) or bf16 (the worker's serving default)
// Exit status: 0 on success, 1 on bad input or load error (message on stderr).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

#include "worker/cpu/cpu_backend.hpp"
#include "worker/engine/kv_sequence.hpp"
#include "worker/model/checkpoint.hpp"

namespace {

using json = nlohmann::json;
using namespace servedeck::worker;

int usage() {
  std::cerr << "usage: servedeck-logits CHECKPOINT_DIR PROMPTS.json OUT.json [--full-logits OUT.f32] "
               "[--top-k K] [--threads N] [--incremental] [--kv-dtype f32|bf16]\n";
  return 1;
}

int run(int argc, char** argv) {
  if (argc < 4) return usage();
  const std::string ckpt_dir = argv[1], prompts_path = argv[2], out_path = argv[3];
  std::string full_path;
  std::size_t top_k = 20, threads = 0;
  bool incremental = false;
  KvDtype kv_dtype = KvDtype::f32;
  for (int i = 4; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--full-logits" && i + 1 < argc) {
      full_path = argv[++i];
    } else if (a == "--top-k" && i + 1 < argc) {
      top_k = std::stoul(argv[++i]);
    } else if (a == "--threads" && i + 1 < argc) {
      threads = std::stoul(argv[++i]);
    } else if (a == "--incremental") {
      incremental = true;
    } else if (a == "--kv-dtype" && i + 1 < argc) {
      const std::string d = argv[++i];
      if (d != "f32" && d != "bf16") return usage();
      kv_dtype = d == "f32" ? KvDtype::f32 : KvDtype::bf16;
    } else {
      return usage();
    }
  }
  std::ifstream pin(prompts_path);
  if (!pin) throw std::runtime_error(prompts_path + ": cannot open");
  std::stringstream ss;
  ss << pin.rdbuf();
  const json prompts = json::parse(ss.str(), nullptr, false);
  if (prompts.is_discarded() || !prompts.is_array())
    throw std::runtime_error(prompts_path + ": expected a JSON array of token-id arrays");

  const auto t_load = std::chrono::steady_clock::now();
  const Checkpoint ckpt = Checkpoint::open(ckpt_dir);
  auto backend = make_cpu_backend(ckpt, CpuBackendOptions{threads, kv_dtype});
  const std::size_t vocab = backend->vocab_size();
  std::cerr << "loaded " << ckpt_dir << " in "
            << std::chrono::duration<double>(std::chrono::steady_clock::now() - t_load).count() << " s\n";

  std::ofstream full;
  if (!full_path.empty()) {
    full.open(full_path, std::ios::binary | std::ios::trunc);
    if (!full) throw std::runtime_error(full_path + ": cannot open for writing");
  }
  json out = {{"vocab_size", vocab}, {"checkpoint", ckpt_dir}, {"incremental", incremental}, {"prompts", json::array()}};
  std::size_t pi = 0;
  for (const auto& p : prompts) {
    if (!p.is_array() || p.empty()) throw std::runtime_error(prompts_path + ": prompt " + std::to_string(pi) + " is not a non-empty array");
    std::vector<int32_t> tokens;
    for (const auto& t : p) {
      if (!t.is_number_integer()) throw std::runtime_error(prompts_path + ": prompt " + std::to_string(pi) + ": non-integer token " + t.dump());
      tokens.push_back(t.get<int32_t>());
    }
    KvBlockPool pool({(tokens.size() + 15) / 16, 16});  // a pool per prompt: one sequence
    backend->allocate_kv_pool(pool.shape());
    KvSequence seq(pool, false);
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<float> logits;
    if (incremental) {
      for (auto tok : tokens) {
        auto row = forward_sequence(*backend, seq, std::span<const int32_t>(&tok, 1), false);
        logits.insert(logits.end(), row.begin(), row.end());
      }
    } else {
      logits = forward_sequence(*backend, seq, tokens, true);
    }
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::cerr << "prompt " << pi << ": " << tokens.size() << " tokens in " << secs << " s\n";
    json positions = json::array();
    std::vector<std::size_t> idx(vocab);
    for (std::size_t t = 0; t < tokens.size(); ++t) {
      const float* row = logits.data() + t * vocab;
      const float mx = *std::max_element(row, row + vocab);
      double s = 0;
      for (std::size_t i = 0; i < vocab; ++i) s += std::exp(static_cast<double>(row[i]) - mx);
      std::iota(idx.begin(), idx.end(), 0);
      const std::size_t k = std::min(top_k, vocab);
      std::partial_sort(idx.begin(), idx.begin() + static_cast<std::ptrdiff_t>(k), idx.end(),
                        [&](std::size_t a, std::size_t b) { return row[a] != row[b] ? row[a] > row[b] : a < b; });
      json top = json::array();
      for (std::size_t j = 0; j < k; ++j) top.push_back({idx[j], row[idx[j]]});
      positions.push_back({{"logsumexp", mx + std::log(s)}, {"top", top}});
    }
    if (full.is_open())
      full.write(reinterpret_cast<const char*>(logits.data()), static_cast<std::streamsize>(logits.size() * sizeof(float)));
    out["prompts"].push_back({{"tokens", tokens}, {"seconds", secs}, {"positions", positions}});
    ++pi;
  }
  std::ofstream o(out_path, std::ios::trunc);
  o << out.dump() << "\n";
  if (!o) throw std::runtime_error(out_path + ": write failed");
  if (full.is_open() && !full) throw std::runtime_error(full_path + ": write failed");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "servedeck-logits: " << e.what() << "\n";
    return 1;
  }
}
