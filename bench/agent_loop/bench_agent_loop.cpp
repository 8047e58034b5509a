// bench_agent_loop: the CUDA backend serving a coding agent's loop, on the Qwen3-30B-A3B shape
// (48 layers, weights synthesised in memory from seed 1, as bench_moe_offload), in one run:
//
// 1. The agent-loop replay: the conversation of make_agent_conversation (the real chat template
//    and tokenizer; every turn resends the whole conversation) through the engine (the serving
//    path: the KV pool, prefix reuse, chunked prefill of --prefill-chunk 4096, greedy decode on
//    the device). Per turn: prompt tokens, cached tokens, TTFT and decode tok/s, all experts
//    resident, with prefix reuse; the same turns without reuse (a second engine with
//    prefix_caching off) every --no-reuse-every turns and at the last. The last turn also with
//    25% and 0% of each layer's experts hot (its variants 1 and 2: a last step the cache has not
//    seen, the conversation before it cached), with and without reuse.
// 2. Decode tok/s against context (--contexts, default 1K, 8K, 32K, 64K): one prompt of the
//    longest context prefilled once into the pool with its blocks published, then per context a
//    sequence that reuses its first N positions and decodes --decode tokens (all resident,
//    greedy; then all resident, sampled as Qwen3's generation_config asks, through the device's
//    top-k selection and through the row copied back; then 0% hot, greedy, --decode-offloaded
//    tokens), against the roofline
//      PCIe bytes / UVA GB/s + (resident weights + hot experts read + KV rows read) / HBM GB/s,
//    the KV rows read being every cached position's bf16 K and V of every layer; the GPU step
//    alone (decode_step_us) against the same roofline. The ceilings are measured first, in the
//    same run (bench/moe_offload/ceilings.hpp).
// Usage: bench_agent_loop --conversation FILE [--contexts 1024,8192,32768,65536] [--decode 64]
//          [--decode-offloaded 16] [--turn-tokens 16] [--no-reuse-every 8] [--skip-replay 1] [--skip-sweep 1]
//   (writes $OUT/bench_agent_loop.json when OUT is set; exits 77 without a CUDA device)
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <future>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <cuda_runtime.h>
#include <nlohmann/json.hpp>

#include "bench/moe_offload/ceilings.hpp"
#include "worker/cuda/cuda_backend.hpp"
#include "worker/cuda/cuda_check.hpp"
#include "worker/engine/engine.hpp"
#include "worker/engine/kv_sequence.hpp"
#include "worker/engine/sampler.hpp"
#include "worker/model/qwen3_30b_a3b_shape.hpp"

using namespace servedeck::worker;
using clk = std::chrono::steady_clock;

namespace {

constexpr int k_vocab = 151936;

double seconds_since(clk::time_point t) { return std::chrono::duration<double>(clk::now() - t).count(); }

struct Prompt {
  uint32_t turn = 0, variant = 0;
  std::vector<int32_t> ids;
};

/// make_agent_conversation's file; std::runtime_error naming what was read and what was expected.
std::vector<Prompt> read_conversation(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error("cannot open " + path);
  char magic[8];
  uint32_t n = 0;
  if (!f.read(magic, 8) || std::memcmp(magic, "SDAL1\0\0\0", 8) != 0 || !f.read(reinterpret_cast<char*>(&n), 4) || n == 0 || n > 4096)
    throw std::runtime_error(path + ": expected a make_agent_conversation file (magic SDAL1, 1..4096 prompts)");
  std::vector<Prompt> out(n);
  for (Prompt& p : out) {
    uint32_t head[3];
    if (!f.read(reinterpret_cast<char*>(head), sizeof head) || head[2] == 0 || head[2] > (1u << 20))
      throw std::runtime_error(path + ": a prompt header is truncated or holds more than 2^20 tokens");
    p.turn = head[0];
    p.variant = head[1];
    p.ids.resize(head[2]);
    if (!f.read(reinterpret_cast<char*>(p.ids.data()), static_cast<std::streamsize>(p.ids.size() * 4)))
      throw std::runtime_error(path + ": prompt of turn " + std::to_string(p.turn) + " is truncated");
    for (int32_t t : p.ids)
      if (t < 0 || t >= k_vocab) throw std::runtime_error(path + ": token id " + std::to_string(t) + " outside the vocabulary");
  }
  return out;
}

/// The engine needs token bytes only for the text it streams, which nobody reads here.
class SilentVocab final : public Vocab {
 public:
  std::string token_bytes(int32_t) const override { return {}; }
  bool is_special(int32_t) const override { return false; }
};

GenerationResult run(Engine& engine, const std::vector<int32_t>& prompt, std::size_t max_tokens) {
  GenerationRequest r;
  r.prompt = prompt;
  r.max_tokens = max_tokens;
  r.sampling.temperature = 0;
  r.ignore_eos = true;
  std::promise<GenerationResult> done;
  auto fut = done.get_future();
  engine.submit(std::move(r), nullptr, [&done](const GenerationResult& res) { done.set_value(res); });
  GenerationResult res = fut.get();
  if (res.finish == FinishReason::error) throw std::runtime_error("request failed: " + res.error);
  return res;
}

double decode_tok_s(const GenerationResult& r) { return r.completion_tokens > 1 && r.decode_s > 0 ? (r.completion_tokens - 1) / r.decode_s : 0; }

const char* hot_label(int slots) { return slots == 128 ? "all" : slots == 32 ? "25%" : slots == 0 ? "0%" : "?"; }

}  // namespace

int main(int argc, char** argv) {
  std::string conversation;
  std::vector<int> contexts{1024, 8192, 32768, 65536};
  int decode = 64, decode_off = 16, turn_tokens = 16, every = 8, layers = 48;
  bool skip_replay = false, skip_sweep = false;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--conversation") conversation = v;
    else if (a == "--contexts") {
      contexts.clear();
      for (std::size_t at = 0; at < v.size();) {
        const std::size_t comma = v.find(',', at);
        contexts.push_back(std::atoi(v.substr(at, comma - at).c_str()));
        at = comma == std::string::npos ? v.size() : comma + 1;
      }
    } else if (a == "--decode") decode = std::atoi(v.c_str());
    else if (a == "--decode-offloaded") decode_off = std::atoi(v.c_str());
    else if (a == "--turn-tokens") turn_tokens = std::atoi(v.c_str());
    else if (a == "--no-reuse-every") every = std::max(1, std::atoi(v.c_str()));
    else if (a == "--layers") layers = std::atoi(v.c_str());
    else if (a == "--skip-replay") skip_replay = std::atoi(v.c_str()) != 0;
    else if (a == "--skip-sweep") skip_sweep = std::atoi(v.c_str()) != 0;
  }
  if (!cuda::cuda_device_available()) {
    std::printf("no CUDA device: this benchmark runs on the GPU machine only\n");
    return 77;
  }
  std::vector<Prompt> prompts;
  if (!skip_replay) {
    if (conversation.empty()) {
      std::fprintf(stderr, "--conversation FILE is required for the replay (make_agent_conversation), or --skip-replay 1\n");
      return 2;
    }
    prompts = read_conversation(conversation);
  }
  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  const servedeck::bench::Ceilings c = servedeck::bench::measure_ceilings();
  std::printf("device: %s; measured ceilings: pinned H2D %.1f GB/s, UVA reads %.1f GB/s, HBM reads %.1f GB/s\n", prop.name, c.h2d_gbs,
              c.uva_gbs, c.hbm_gbs);

  // The pool: the longest context and its decode, or the conversation twice over (its cached
  // turns and the last turn's variants), whichever is larger, in blocks of 16.
  std::size_t longest = 0;
  for (const Prompt& p : prompts) longest = std::max(longest, p.ids.size());
  std::size_t pool_tokens = std::max<std::size_t>(2 * longest + 4096, static_cast<std::size_t>(*std::max_element(contexts.begin(), contexts.end())) +
                                                                            static_cast<std::size_t>(std::max(decode, decode_off)) + 4096);
  pool_tokens = (pool_tokens + 15) / 16 * 16;
  const ModelDescription d = qwen3_30b_a3b_shape(layers);
  cuda::CudaBackendOptions opt;
  opt.hot_slots = 128;
  const std::size_t kvb = static_cast<std::size_t>(d.num_layers) * 2 * 4 * 128 * 2;
  opt.kv_cache_bytes = pool_tokens * kvb;
  auto t0 = clk::now();
  auto backend = cuda::make_synthetic_cuda_backend(d, 1, opt);
  std::printf("model: Qwen3-30B-A3B shape, %d layers, weights SYNTHESISED from seed 1; load %.1f s\n", layers, seconds_since(t0));
  std::printf("KV bytes per token: %zu (bf16 K and V, %d layers x 2 x 4 KV heads x 128), against %lld with fp32: x%.2f\n",
              backend->kv_bytes_per_token(), layers, static_cast<long long>(d.kv_bytes_per_token_f32()),
              static_cast<double>(backend->kv_bytes_per_token()) / static_cast<double>(d.kv_bytes_per_token_f32()));
  std::printf("KV pool: %zu tokens, %.2f GiB\n", pool_tokens, static_cast<double>(pool_tokens * kvb) / 1073741824.0);
  nlohmann::json out = {{"device", prop.name}, {"h2d_gbs", c.h2d_gbs}, {"uva_gbs", c.uva_gbs}, {"hbm_gbs", c.hbm_gbs},
                        {"kv_bytes_per_token", backend->kv_bytes_per_token()}, {"pool_tokens", pool_tokens}};

  if (!skip_replay) {
    SilentVocab vocab;
    EngineOptions eo;
    eo.kv_cache_bytes = pool_tokens * kvb;
    eo.max_model_len = pool_tokens;
    eo.prefill_chunk = 4096;
    uint32_t last_turn = 0;
    for (const Prompt& p : prompts) last_turn = std::max(last_turn, p.turn);
    auto find = [&](uint32_t turn, uint32_t variant) -> const Prompt* {
      for (const Prompt& p : prompts)
        if (p.turn == turn && p.variant == variant) return &p;
      return nullptr;
    };
    struct Row {
      uint32_t turn = 0, variant = 0;
      int slots = 128;
      std::size_t prompt = 0, cached = 0;
      double ttft = 0, tok_s = 0, ttft_cold = -1, tok_s_cold = 0;
    };
    std::vector<Row> rows;
    // The last turn's variants under the three hot fractions: variant 0 all resident, 1 at 25%, 2 at 0%.
    const int slots_of_variant[3] = {128, 32, 0};
    {
      eo.prefix_caching = true;
      Engine engine(*backend, vocab, eo);
      // First use (the decode graph's capture, cuBLAS's and the kernels' first launches) outside
      // the replay: one short request that shares no block with the conversation.
      std::vector<int32_t> warm;
      for (int i = 0; i < 256; ++i) warm.push_back((i * 7919 + 5) % 151643);
      (void)run(engine, warm, 4);
      for (uint32_t t = 0; t <= last_turn; ++t) {
        const Prompt* p = find(t, 0);
        if (!p) continue;
        const GenerationResult r = run(engine, p->ids, static_cast<std::size_t>(turn_tokens));
        rows.push_back({t, 0, 128, r.prompt_tokens, r.cached_tokens, r.ttft_s, decode_tok_s(r)});
        std::printf("turn %2u: prompt %6zu, cached %6zu, TTFT %.3f s, decode %.1f tok/s\n", t, r.prompt_tokens, r.cached_tokens, r.ttft_s,
                    decode_tok_s(r));
        std::fflush(stdout);
      }
      for (uint32_t v = 1; v < 3; ++v)
        if (const Prompt* p = find(last_turn, v)) {
          backend->set_hot_slots(slots_of_variant[v]);
          const GenerationResult r = run(engine, p->ids, static_cast<std::size_t>(turn_tokens));
          rows.push_back({last_turn, v, slots_of_variant[v], r.prompt_tokens, r.cached_tokens, r.ttft_s, decode_tok_s(r)});
          std::printf("turn %2u (variant %u, %s hot): prompt %6zu, cached %6zu, TTFT %.3f s, decode %.1f tok/s\n", last_turn, v,
                      hot_label(slots_of_variant[v]), r.prompt_tokens, r.cached_tokens, r.ttft_s, decode_tok_s(r));
          std::fflush(stdout);
        }
      std::printf("engine with reuse: kv pool allocations %zu, backend allocations %zu, decode graph captures %zu\n",
                  backend->kv_pool_allocations(), backend->allocations(), backend->graph_captures());
    }
    {
      eo.prefix_caching = false;
      Engine engine(*backend, vocab, eo);
      (void)run(engine, std::vector<int32_t>(256, 17), 4);  // as above
      for (Row& row : rows) {
        const bool sample = row.variant != 0 || row.turn % static_cast<uint32_t>(every) == 0 || row.turn == last_turn;
        if (!sample) continue;
        backend->set_hot_slots(row.slots);
        const GenerationResult r = run(engine, find(row.turn, row.variant)->ids, static_cast<std::size_t>(turn_tokens));
        row.ttft_cold = r.ttft_s;
        row.tok_s_cold = decode_tok_s(r);
        std::printf("turn %2u (variant %u, %s hot) without reuse: TTFT %.3f s, decode %.1f tok/s\n", row.turn, row.variant,
                    hot_label(row.slots), r.ttft_s, decode_tok_s(r));
        std::fflush(stdout);
      }
    }
    backend->set_hot_slots(128);
    std::printf("\nagent-loop replay (%zu turns; engine: --prefill-chunk 4096, %d greedy tokens per turn; TTFT = prefill + first token)\n",
                static_cast<std::size_t>(last_turn) + 1, turn_tokens);
    std::printf("%5s %4s %7s %8s %8s %11s %10s %14s %9s\n", "turn", "hot", "prompt", "cached", "new", "TTFT reuse", "decode t/s",
                "TTFT no reuse", "ratio");
    nlohmann::json jr = nlohmann::json::array();
    for (const Row& r : rows) {
      char cold[32] = "-", ratio[32] = "-";
      if (r.ttft_cold >= 0) {
        std::snprintf(cold, sizeof cold, "%.3f s", r.ttft_cold);
        std::snprintf(ratio, sizeof ratio, "%.1fx", r.ttft_cold / r.ttft);
      }
      std::printf("%5u %4s %7zu %8zu %8zu %9.3f s %10.1f %14s %9s\n", r.turn, hot_label(r.slots), r.prompt, r.cached, r.prompt - r.cached,
                  r.ttft, r.tok_s, cold, ratio);
      jr.push_back({{"turn", r.turn}, {"variant", r.variant}, {"hot_slots", r.slots}, {"prompt_tokens", r.prompt}, {"cached_tokens", r.cached},
                    {"ttft_s", r.ttft}, {"decode_tok_s", r.tok_s}, {"ttft_no_reuse_s", r.ttft_cold}, {"decode_tok_s_no_reuse", r.tok_s_cold}});
    }
    out["replay"] = jr;
  }

  if (!skip_sweep) {
    const int max_ctx = *std::max_element(contexts.begin(), contexts.end());
    KvBlockPool pool({pool_tokens / 16, 16});
    backend->allocate_kv_pool(pool.shape());
    backend->set_hot_slots(128);
    std::vector<int32_t> ids;
    for (int i = 0; i <= max_ctx; ++i) ids.push_back((i * 7919 + 11) % 151643);  // each row's next token included
    {
      KvSequence writer(pool, true);
      auto tp = clk::now();
      (void)forward_sequence(*backend, writer, ids, false);
      std::printf("\ndecode vs context: a %d-token prompt prefilled once (%.2f s, all resident), its blocks published; each row\n"
                  "reuses its first N positions and decodes (greedy: forward_greedy; top-k: forward_top_k + the host's draw; row: the row\n"
                  "copied back + the host's draw; sampled at T 0.7 / top-k 20 / top-p 0.8)\n",
                  max_ctx, seconds_since(tp));
    }
    const double block = static_cast<double>(backend->expert_block_bytes());
    const double dense_bytes = static_cast<double>(backend->resident_bytes()) - static_cast<double>(k_vocab) * 2048 * 2;
    std::printf("%5s %7s %9s %11s %12s %10s %9s %10s %10s %12s %8s\n", "hot", "context", "tok/s", "roofline", "achieved", "ms/token", "GPU ms",
                "GPU achvd", "KV MB/tok", "PCIe MB/tok", "mode");
    nlohmann::json js = nlohmann::json::array();
    // Sampled as Qwen3's generation_config asks (T 0.7, top-k 20, top-p 0.8): "top-k", the
    // engine's path (forward_top_k: the 20 best selected on the device, drawn on the host); "row",
    // the path of a request with logprobs or logit changes (the row copied back, drawn on the
    // host). "greedy": forward_greedy.
    enum class Draw { greedy, top_k, row };
    struct Mode {
      int slots;
      Draw draw;
    };
    for (const Mode mode : {Mode{128, Draw::greedy}, Mode{128, Draw::top_k}, Mode{128, Draw::row}, Mode{0, Draw::greedy}}) {
      const int slots = mode.slots;
      backend->set_hot_slots(slots);
      const int n = slots == 128 ? decode : decode_off;
      for (const int ctx : contexts) {
        KvSequence seq(pool, true);
        const std::size_t reused = seq.attach_prefix(ids, static_cast<std::size_t>(ctx));
        if (reused != static_cast<std::size_t>(ctx / 16 * 16)) throw std::runtime_error("the sweep's prefix was evicted");
        int32_t next = ids[reused];
        Sampler sampler(SamplingParams{0.7, 20, 0.8, 1});
        auto step = [&] {
          seq.reserve(seq.length() + 1);
          const int32_t in[1] = {next};
          if (mode.draw == Draw::row) {
            const std::vector<float> row = backend->forward(seq.view(), in, false);
            next = sampler.sample(std::span<const float>(row.data(), k_vocab));
          } else if (mode.draw == Draw::top_k) {
            const auto sel = backend->forward_top_k(seq.view(), next, 20);
            next = sampler.sample_top(sel.best, sel.argmax);
          } else {
            next = backend->forward_greedy(seq.view(), next);
          }
          seq.append(in);
        };
        step();  // the first step (and the graph, on the very first) outside the timed ones
        step();
        backend->reset_stats();
        const std::size_t len0 = seq.length();
        auto td = clk::now();
        for (int i = 0; i < n; ++i) step();
        const double sec = seconds_since(td);
        const auto st = backend->stats();
        const double miss = static_cast<double>(st.misses) / n, hit = static_cast<double>(st.hot_hits) / n;
        const double kv = static_cast<double>(backend->kv_bytes_per_token()) * (static_cast<double>(len0) + (n + 1) / 2.0);
        const double roof_s = miss * block / (c.uva_gbs * 1e9) + (dense_bytes + hit * block + kv) / (c.hbm_gbs * 1e9);
        const double tok_s = n / sec;
        const double step_us = backend->decode_step_us(slots == 128 ? 16 : 2);
        const char* mode_name = mode.draw == Draw::row ? "row" : mode.draw == Draw::top_k ? "top-k" : "greedy";
        std::printf("%5s %7d %9.2f %11.2f %11.1f%% %10.3f %9.3f %9.1f%% %10.1f %12.1f %8s\n", hot_label(slots), ctx, tok_s, 1 / roof_s,
                    100 * roof_s * tok_s, 1000 * sec / n, step_us / 1000, 100 * roof_s * 1e6 / step_us, kv / 1e6, miss * block / 1e6,
                    mode_name);
        std::fflush(stdout);
        js.push_back({{"hot_slots", slots}, {"mode", mode_name}, {"context", ctx}, {"decode_tok_s", tok_s}, {"roofline_tok_s", 1 / roof_s},
                      {"achieved_fraction", roof_s * tok_s}, {"gpu_step_us", step_us}, {"gpu_achieved_fraction", roof_s * 1e6 / step_us},
                      {"kv_bytes_per_token_read", kv}, {"pcie_bytes_per_token", miss * block}});
      }
    }
    out["decode_vs_context"] = js;
    std::printf("roofline: PCIe bytes / UVA GB/s + (resident weights + hot experts + KV rows read) / HBM GB/s, ceilings above;\n"
                "GPU achvd: the same roofline over the captured step alone (decode_step_us)\n");
  }
  std::printf("backend: allocations %zu, decode graph captures %zu, KV pool allocations %zu\n", backend->allocations(),
              backend->graph_captures(), backend->kv_pool_allocations());
  if (const char* dir = std::getenv("OUT")) std::ofstream(std::string(dir) + "/bench_agent_loop.json") << out.dump(2) << "\n";
  return 0;
}
