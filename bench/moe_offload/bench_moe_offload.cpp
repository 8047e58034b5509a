// Benchmark of the worker's CUDA offload path on the full Qwen3-30B-A3B shape (48 layers,
// hidden 2048, 32 query / 4 KV heads of 128, 128 experts top-8, moe_intermediate 768, vocab
// 151936, bf16). Weights are synthesised in memory from a seed (a checkpoint of this size does
// not fit the GPU machine's disk next to everything else); the output says so.
//
// In one run it measures the machine's own ceilings (pinned host→device copy, zero-copy UVA
// reads by our GEMV kernel, HBM reads by the same kernel), then decode tok/s (batch 1, 128-token
// prompt, 256 new tokens, greedy) with the hot-expert cache at 0%, 25%, 50% and 100% of experts
// (and all resident after a 4096-token prompt), bytes read over PCIe per token, and achieved
// time ÷ roofline time, where
//   roofline/token = PCIe bytes / UVA GB/s + VRAM bytes read (weights, KV rows) / HBM GB/s.
// Then prefill tok/s at 512, 4096 and 16384 tokens (one chunk each), all experts resident and all
// offloaded (0% hot: every routed expert staged through the VRAM buffers), beside the staging
// roofline: expert bytes staged ÷ measured pinned H2D GB/s, and the achieved fraction.
// Usage: bench_moe_offload [--decode N] [--prompt N] [--layers N] [--prefill-max N] [--breakdown-only 1]
//                          [--stage-buffers N] [--experts bf16|fp8|nvfp4] [--breakdown 0] [--long-prompt N]
//   --experts: the routed experts' format; fp8 (128x128 blocks) and nvfp4 quantise the synthesised
//   bf16 experts in memory (the published quantisers' arithmetic), and the roofline counts that
//   format's bytes. --breakdown 0 skips the per-kernel breakdown; --long-prompt N the prompt of the "all @N" row (4096; 0: no such row).
//   --config PATH: another model's config.json instead of the Qwen3-30B-A3B shape, cut to --layers
//   (e.g. bench/moe_offload/glm-4.5-air/config.json; the breakdown keeps the Qwen3 shapes).
//   (writes JSON to $OUT if set)
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include <cuda_runtime.h>
#include <nlohmann/json.hpp>

#include "worker/cuda/cuda_backend.hpp"
#include "worker/cuda/cuda_check.hpp"
#include "worker/cuda/fused.cuh"
#include "worker/cuda/kernels.cuh"
#include "worker/engine/kv_sequence.hpp"
#include "worker/engine/sampler.hpp"
#include "worker/model/qwen3_30b_a3b_shape.hpp"
#include "bench/moe_offload/decode_trace_report.hpp"
#include "bench/moe_offload/ceilings.hpp"
#include "bench/moe_offload/graph_timing.hpp"
#include "bench/moe_offload/flash_bench.hpp"

using namespace servedeck::worker;
using clk = std::chrono::steady_clock;
using servedeck::bench::Ceilings;
using servedeck::bench::measure_ceilings;

namespace {

double seconds_since(clk::time_point t) { return std::chrono::duration<double>(clk::now() - t).count(); }

/// Per-kernel breakdown of one decode layer on the benchmark shapes: each fused launch timed
/// as a CUDA graph of `reps` back-to-back PDL launches (as in the decode graph), each launch on
/// a different weight copy / expert set so repeated launches do not hit in L2.
void kernel_breakdown(double hbm_gbs) {
  using bf16 = __nv_bfloat16;
  constexpr int reps = 16, H = 2048, QD = 4096, KVD = 512, E = 128, K = 8, I = 768, V = 151936, CAP = 512;
  cudaStream_t st;
  CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  auto dalloc = [](std::size_t bytes) {
    void* p = nullptr;
    CUDA_CHECK(cudaMalloc(&p, bytes));
    CUDA_CHECK(cudaMemset(p, 0x3c, bytes));  // bf16 0x3c3c ≈ 0.0115, fp32 ≈ 0.0115: finite, nonzero
    return p;
  };
  const std::size_t block = 3ull * I * H;
  auto* qkv_w = static_cast<bf16*>(dalloc(reps * static_cast<std::size_t>(QD + 2 * KVD) * H * 2));
  auto* o_w = static_cast<bf16*>(dalloc(reps * static_cast<std::size_t>(H) * QD * 2));
  auto* r_w = static_cast<bf16*>(dalloc(reps * static_cast<std::size_t>(E) * H * 2));
  auto* experts = static_cast<bf16*>(dalloc(E * block * 2));
  auto* lm = static_cast<bf16*>(dalloc(static_cast<std::size_t>(V) * H * 2));
  auto* nw = static_cast<bf16*>(dalloc(H * 2));
  auto* x = static_cast<float*>(dalloc(H * 4));
  auto* xn = static_cast<float*>(dalloc(H * 4));
  auto* qkv = static_cast<float*>(dalloc((QD + 2 * KVD) * 4));
  auto* attn = static_cast<float*>(dalloc(QD * 4));
  // The attention's context: CAP positions in a paged bf16 pool of blocks of 16, the table in
  // reverse order.
  auto* kc = static_cast<bf16*>(dalloc(static_cast<std::size_t>(CAP) * KVD * 2));
  auto* vc = static_cast<bf16*>(dalloc(static_cast<std::size_t>(CAP) * KVD * 2));
  std::vector<int32_t> htab(CAP / 16);
  for (int i = 0; i < CAP / 16; ++i) htab[static_cast<std::size_t>(i)] = CAP / 16 - 1 - i;
  auto* ktable = static_cast<int32_t*>(dalloc(htab.size() * 4));
  CUDA_CHECK(cudaMemcpy(ktable, htab.data(), htab.size() * 4, cudaMemcpyHostToDevice));
  const cuda::PagedKv pkv{kc, vc, ktable, 16};
  auto* logits = static_cast<float*>(dalloc(V * 4));
  auto* act = static_cast<float*>(dalloc(K * I * 4));
  auto* rw = static_cast<float*>(dalloc(K * 4));
  auto* done = static_cast<unsigned int*>(dalloc(4));
  CUDA_CHECK(cudaMemset(done, 0, 4));
  auto* counters = static_cast<unsigned long long*>(dalloc(2 * 8));
  auto* lc = static_cast<unsigned long long*>(dalloc(E * 8));
  auto* flags = static_cast<uint8_t*>(dalloc(E));
  std::vector<int32_t> hid(reps * K);
  for (int i = 0; i < reps * K; ++i) hid[static_cast<std::size_t>(i)] = (i * 37 + i / K * 11) % E;
  auto* ids = static_cast<int32_t*>(dalloc(hid.size() * 4));
  auto* router_ids = static_cast<int32_t*>(dalloc(K * 4));
  CUDA_CHECK(cudaMemcpy(ids, hid.data(), hid.size() * 4, cudaMemcpyHostToDevice));
  const int32_t hpos = 255;
  auto* pos = static_cast<int32_t*>(dalloc(4));
  CUDA_CHECK(cudaMemcpy(pos, &hpos, 4, cudaMemcpyHostToDevice));
  const std::vector<float> f = cuda::rope_inv_freq(1e6f, 128);
  auto* freq = static_cast<float*>(dalloc(f.size() * 4));
  CUDA_CHECK(cudaMemcpy(freq, f.data(), f.size() * 4, cudaMemcpyHostToDevice));
  std::vector<const bf16*> ht(E);
  for (int e = 0; e < E; ++e) ht[static_cast<std::size_t>(e)] = experts + block * static_cast<std::size_t>(e);
  auto* table = static_cast<const bf16**>(dalloc(E * sizeof(void*)));
  CUDA_CHECK(cudaMemcpy(table, ht.data(), E * sizeof(void*), cudaMemcpyHostToDevice));
  const cuda::ExpertTable t{table, H, I};
  const int splits = cuda::attention_splits(4);
  auto* ascratch = static_cast<float*>(dalloc(cuda::attention_scratch_floats(32, 128, splits) * 4));
  auto* acount = static_cast<unsigned int*>(dalloc(32 * 4));
  CUDA_CHECK(cudaMemset(acount, 0, 32 * 4));
  const cuda::AttentionShape shape{32, 4, 128, 128, 1e-6f, freq, splits, ascratch, acount};
  // µs per body(i) call: the n calls captured as one graph, median of 5 timed launches.
  auto graph_us = [&](int n, const std::function<void(int)>& body) { return servedeck::bench::graph_us_per_call(st, n, body); };
  auto time_graph = [&](const char* name, double bytes, int n, const std::function<void(int)>& body) {
    const double us = graph_us(n, body);
    std::printf("%-28s %9.2f %10.2f %9.0f %8.1f%%\n", name, us, bytes / 1e6, bytes / us / 1e3, 100 * bytes / us / 1e3 / hbm_gbs);
    return us;
  };
  std::printf("\nper-kernel decode breakdown (graph of %d PDL launches each, distinct weights per launch)\n", reps);
  std::printf("%-28s %9s %10s %9s %9s\n", "kernel", "us", "MB read", "GB/s", "of HBM");
  double layer = 0;
  layer += time_graph("norm+qkv gemv (5120x2048)", (QD + 2.0 * KVD) * H * 2, reps, [&](int i) {
    cuda::launch_norm_gemv_bf16(qkv_w + static_cast<std::size_t>(i) * (QD + 2 * KVD) * H, x, nw, 1e-6f, qkv, QD + 2 * KVD, H,
                                false, nullptr, st, true);
  });
  layer += time_graph("attention paged (pos 255)", 256.0 * KVD * 2 * 2, reps, [&](int) {
    cuda::launch_attention_decode_paged(qkv, nw, nw, pkv, attn, shape, pos, st, true);
  });
  layer += time_graph("o-proj gemv (2048x4096)", 2.0 * H * QD, reps, [&](int i) {
    cuda::launch_gemv_bf16_pdl(o_w + static_cast<std::size_t>(i) * H * QD, attn, x, H, QD, true, st, true);
  });
  layer += time_graph("norm+router+topk (128x2048)", 2.0 * E * H, reps, [&](int i) {
    cuda::launch_router_fused(r_w + static_cast<std::size_t>(i) * E * H, x, nw, 1e-6f, xn, E, H, K, true,
                              cuda::RouterOutputs{logits, router_ids, rw, done, flags, counters, lc}, st, true);
  });
  layer += time_graph("moe gate_up+swiglu (8x1536)", 2.0 * K * 2 * I * H, reps, [&](int i) {
    cuda::launch_moe_gate_up_fused(t, xn, ids + i * K, K, act, st, true);
  });
  layer += time_graph("moe down+reduce (8x2048x768)", 2.0 * K * H * I, reps, [&](int i) {
    cuda::launch_moe_down_fused(t, act, ids + i * K, rw, K, x, st, true);
  });
  std::printf("%-28s %9.2f   (x 48 layers = %.2f ms)\n", "sum per layer", layer, layer * 48 / 1000);
  // The six kernels in step order, one layer after another (distinct weights per layer): the
  // layer as the step runs it, against the sum of its kernels timed alone.
  const double layer_bytes = 2.0 * ((QD + 2.0 * KVD) * H + H * QD + E * H + K * 3.0 * I * H) + 256.0 * KVD * 4;
  // skip < 0: the whole layer; else the layer without kernel `skip` (its inputs are left as
  // they are), so full minus that is the kernel's marginal cost inside the sequence.
  auto layer_sequence = [&](int i, int skip) {
    const std::size_t qkv_sz = static_cast<std::size_t>(QD + 2 * KVD) * H;
    const bf16* rwt = r_w + static_cast<std::size_t>(i) * E * H;
    if (skip != 0) cuda::launch_norm_gemv_bf16(qkv_w + i * qkv_sz, x, nw, 1e-6f, qkv, QD + 2 * KVD, H, false, nullptr, st, true);
    if (skip != 1) cuda::launch_attention_decode_paged(qkv, nw, nw, pkv, attn, shape, pos, st, true);
    if (skip != 2) cuda::launch_gemv_bf16_pdl(o_w + static_cast<std::size_t>(i) * H * QD, attn, x, H, QD, true, st, true);
    if (skip != 3)
      cuda::launch_router_fused(rwt, x, nw, 1e-6f, xn, E, H, K, true, cuda::RouterOutputs{logits, router_ids, rw, done, flags, counters, lc},
                                st, true);
    if (skip != 4) cuda::launch_moe_gate_up_fused(t, xn, ids + i * K, K, act, st, true);
    if (skip != 5) cuda::launch_moe_down_fused(t, act, ids + i * K, rw, K, x, st, true);
  };
  const double full = time_graph("layer sequence (6 kernels)", layer_bytes, reps, [&](int i) { layer_sequence(i, -1); });
  std::printf("marginal cost in the sequence (layer minus the layer without the kernel), us:");
  const char* short_names[] = {"qkv", "attention", "o-proj", "router", "gate_up", "down"};
  for (int k = 0; k < 6; ++k)
    std::printf(" %s %.2f", short_names[k], full - graph_us(reps, [&](int i) { layer_sequence(i, k); }));
  std::printf("\n");
  time_graph("norm+lm_head (151936x2048)", 2.0 * V * H, 4, [&](int) {
    cuda::launch_norm_gemv_bf16(lm, x, nw, 1e-6f, logits, V, H, false, nullptr, st, true);
  });
  CUDA_CHECK(cudaStreamSynchronize(st));
  for (void* p : {static_cast<void*>(qkv_w), static_cast<void*>(o_w), static_cast<void*>(r_w), static_cast<void*>(experts),
                  static_cast<void*>(lm), static_cast<void*>(nw), static_cast<void*>(x), static_cast<void*>(xn),
                  static_cast<void*>(qkv), static_cast<void*>(attn), static_cast<void*>(kc), static_cast<void*>(vc),
                  static_cast<void*>(logits), static_cast<void*>(act), static_cast<void*>(rw), static_cast<void*>(done),
                  static_cast<void*>(counters), static_cast<void*>(lc), static_cast<void*>(flags), static_cast<void*>(ids), static_cast<void*>(router_ids),
                  static_cast<void*>(pos), static_cast<void*>(freq), static_cast<void*>(table), static_cast<void*>(ascratch),
                  static_cast<void*>(acount), static_cast<void*>(ktable)})
    CUDA_CHECK(cudaFree(p));
  CUDA_CHECK(cudaStreamDestroy(st));
}

double rss_gib() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::stod(line.substr(6)) / (1024.0 * 1024.0);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  int decode = 256, prompt = 128, layers = 48, prefill_max = 16384, stage_buffers = 16, long_prompt = 4096;
  bool breakdown_only = false, breakdown = true;
  cuda::ExpertFormat experts = cuda::ExpertFormat::bf16;
  std::string experts_name = "bf16", config_path;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--decode") decode = std::atoi(argv[i + 1]);
    else if (a == "--config") config_path = argv[i + 1];
    else if (a == "--prompt") prompt = std::atoi(argv[i + 1]);
    else if (a == "--layers") layers = std::atoi(argv[i + 1]);
    else if (a == "--prefill-max") prefill_max = std::atoi(argv[i + 1]);
    else if (a == "--breakdown-only") breakdown_only = std::atoi(argv[i + 1]) != 0;
    else if (a == "--stage-buffers") stage_buffers = std::atoi(argv[i + 1]);
    else if (a == "--breakdown") breakdown = std::atoi(argv[i + 1]) != 0;
    else if (a == "--long-prompt") long_prompt = std::atoi(argv[i + 1]);
    else if (a == "--experts") {
      experts_name = argv[i + 1];
      if (experts_name == "fp8") experts = cuda::ExpertFormat::fp8_block;
      else if (experts_name == "nvfp4") experts = cuda::ExpertFormat::nvfp4;
      else if (experts_name != "bf16") {
        std::fprintf(stderr, "--experts %s: expected bf16, fp8 or nvfp4\n", argv[i + 1]);
        return 2;
      }
    }
  }
  if (!cuda::cuda_device_available()) {
    std::printf("no CUDA device: this benchmark runs on the GPU machine only\n");
    return 77;
  }
  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %.1f GiB; L2 %.1f MiB, of it settable aside for evict_last lines %.1f MiB\n", prop.name,
              prop.totalGlobalMem / 1073741824.0, prop.l2CacheSize / 1048576.0, prop.persistingL2CacheMaxSize / 1048576.0);
  const Ceilings c = measure_ceilings();
  std::printf("measured ceilings: pinned H2D copy %.1f GB/s, UVA reads (our GEMV) %.1f GB/s, HBM reads (our GEMV) %.1f GB/s\n",
              c.h2d_gbs, c.uva_gbs, c.hbm_gbs);

  if (breakdown) {
    kernel_breakdown(c.hbm_gbs);
    servedeck::bench::flash_attention_bench();
  }
  if (breakdown_only) return 0;

  ModelDescription d = config_path.empty() ? qwen3_30b_a3b_shape(layers) : model_cut_to_layers(load_model_config(config_path), layers);
  std::printf("model: %s, %d layers, weights SYNTHESISED in memory from seed 1 (no checkpoint on disk); routed experts %s%s\n",
              config_path.empty() ? "Qwen3-30B-A3B shape" : (d.model_type + " shape of " + config_path).c_str(), layers,
              experts_name.c_str(), experts == cuda::ExpertFormat::bf16 ? "" : " (the bf16 draws quantised in memory)");
  const int token_mod = static_cast<int>(std::min<std::int64_t>(151643, d.vocab_size));  // prompt ids below both vocabularies
  auto t0 = clk::now();
  cuda::CudaBackendOptions opt;
  opt.hot_slots = 0;
  opt.prefill_chunk = std::max(prefill_max, prompt);  // each benchmarked prompt is one chunk
  opt.stage_buffers = stage_buffers;
  auto backend = cuda::make_synthetic_cuda_backend(d, 1, opt, experts);
  const double load_s = seconds_since(t0);
  const double expert_gib = backend->expert_bytes() / 1073741824.0;
  std::printf("load %.1f s; experts %.2f GiB in pinned host memory (mapped %.2f GiB, ratio %.4f; process RSS %.2f GiB = %.3f x experts); resident %.2f GiB\n",
              load_s, expert_gib, backend->host_bytes_mapped() / 1073741824.0,
              static_cast<double>(backend->host_bytes_mapped()) / backend->expert_bytes(), rss_gib(), rss_gib() / expert_gib,
              backend->resident_bytes() / 1073741824.0);

  // One KV pool for every row below (sequences made and released in it; one decode graph).
  const std::size_t pool_tokens = static_cast<std::size_t>(std::max({prefill_max, 4096, prompt, long_prompt}) + decode + 64);
  KvBlockPool pool({(pool_tokens + 15) / 16, 16});
  backend->allocate_kv_pool(pool.shape());
  const double block = static_cast<double>(backend->expert_block_bytes());
  // VRAM bytes read per decoded token outside the experts: everything resident except the
  // embedding table (one row) — attention, router and norm weights, and lm_head.
  const double dense_bytes = static_cast<double>(backend->resident_bytes()) - static_cast<double>(d.vocab_size) * static_cast<double>(d.hidden_size) * 2;
  nlohmann::json rows = nlohmann::json::array();
  std::printf("\n%-10s %9s %10s %12s %14s %13s %12s %9s %10s %10s\n", "hot", "hit_rate", "tok/s", "prefill128 t/s", "PCIe MB/token",
              "roofline t/s", "achieved", "ms/token", "GPU ms", "GPU achvd");
  struct Row {
    int slots;
    bool pdl;
    int prompt;  // tokens before the decoded ones
  };
  // KV bytes a decode step reads: every cached row of every layer (bf16 K and V).
  const double kv_row_bytes = static_cast<double>(backend->kv_bytes_per_token());
  double host_argmax_us = 0;
  std::vector<Row> plan{Row{0, true, prompt}, Row{32, true, prompt}, Row{64, true, prompt}, Row{128, false, prompt},
                        Row{128, true, prompt}};
  if (long_prompt > 0) plan.push_back(Row{128, true, long_prompt});
  for (const Row row : plan) {
    const int slots = row.slots;
    const bool pdl = row.pdl;
    if (slots != backend->hot_slots()) backend->set_hot_slots(slots);
    backend->set_use_pdl(pdl);
    KvSequence cache(pool, false);
    std::vector<int32_t> ids;
    for (int i = 0; i < row.prompt; ++i) ids.push_back((i * 7919 + 11) % token_mod);
    auto tp = clk::now();
    auto logits = forward_sequence(*backend, cache, ids, false);
    const double prefill_s = seconds_since(tp);
    backend->reset_stats();
    auto td = clk::now();
    // The engine's greedy decode: the pick made on the device, one int32 copied back per token
    // (Backend::forward_greedy; the first from the prefill's row).
    int32_t next = servedeck::worker::argmax(logits);
    for (int i = 0; i < decode; ++i) {
      cache.reserve(cache.length() + 1);  // as the engine: blocks before the step, then append
      const int32_t in[1] = {next};
      next = backend->forward_greedy(cache.view(), next);
      cache.append(in);
    }
    const double decode_s = seconds_since(td);
    const auto st = backend->stats();
    const double per_tok_miss = static_cast<double>(st.misses) / decode;
    const double per_tok_hit = static_cast<double>(st.hot_hits) / decode;
    const double pcie_bytes = per_tok_miss * block;
    const double kv_bytes = kv_row_bytes * (row.prompt + (decode + 1) / 2.0);  // mean cached rows while decoding
    const double roof_s = pcie_bytes / (c.uva_gbs * 1e9) + (dense_bytes + per_tok_hit * block + kv_bytes) / (c.hbm_gbs * 1e9);
    const double tok_s = decode / decode_s;
    const double achieved = roof_s * tok_s;
    // The step's graph alone (GPU time; the rest of ms/token is the host's share between steps).
    const double step_us = backend->decode_step_us(32);
    if (slots == 128 && pdl && row.prompt == prompt) {
      // The host's share of ms/token, in part: the engine's greedy pick (worker::argmax) over the logits row.
      auto ta = clk::now();
      int32_t sink = 0;
      for (int r = 0; r < 50; ++r) sink += servedeck::worker::argmax(logits);
      host_argmax_us = seconds_since(ta) / 50 * 1e6 + (sink == -1 ? 1 : 0);
    }
    if ((slots == 128 || slots == 0) && pdl) {
      std::printf("\ntrace of the %s step after %d tokens:", slots == 0 ? "0%-hot" : "all-resident", row.prompt);
      servedeck::bench::decode_trace_report(*backend);  // trace builds only
    }
    char label[24];
    std::snprintf(label, sizeof label, "%d%%", slots * 100 / 128);
    if (slots == 128 && !pdl) std::snprintf(label, sizeof label, "all noPDL");
    else if (slots == 128 && row.prompt != prompt) std::snprintf(label, sizeof label, "all @%d", row.prompt);
    else if (slots == 128) std::snprintf(label, sizeof label, "all");
    std::printf("%-10s %8.1f%% %10.2f %12.2f %14.1f %13.2f %11.1f%% %9.2f %10.3f %9.1f%%\n", label,
                100 * st.hit_rate(), tok_s, row.prompt / prefill_s, pcie_bytes / 1e6, 1 / roof_s, 100 * achieved, 1000 * decode_s / decode,
                step_us / 1000, 100 * roof_s * 1e6 / step_us);
    rows.push_back({{"hot_slots", slots}, {"pdl", pdl}, {"prompt_tokens", row.prompt}, {"hit_rate", st.hit_rate()}, {"decode_tok_s", tok_s},
                    {"prefill_tok_s_decode_path", row.prompt / prefill_s}, {"kv_bytes_per_token", kv_bytes}, {"pcie_bytes_per_token", pcie_bytes},
                    {"roofline_tok_s", 1 / roof_s}, {"achieved_fraction", achieved},
                    {"gpu_step_us", step_us}});
  }
  std::printf("host share of the all-resident row: ms/token - GPU ms (the decode loop is the engine's greedy path, forward_greedy:\n"
              "the pick made on the device, one int32 copied back; the host's argmax over a logits row, which sampled decoding\n"
              "still pays, measured here: %.1f us)\n",
              host_argmax_us);
  std::printf("\nprefill128 column: the prompt before each decode row (%d tokens; %d for \"all @%d\"), through the staged prefill\n"
              "path. Roofline: PCIe bytes / UVA GB/s + (resident weights + hot experts + the KV rows read) / HBM GB/s.\n", prompt,
              long_prompt, long_prompt);

  // Prefill rows. The backend is at all-resident now; warm up once at the largest size so the
  // prefill buffers and cuBLAS are set up outside the timed runs.
  nlohmann::json prows = nlohmann::json::array();
  std::vector<int> sizes;
  for (int n : {512, 4096, 16384})
    if (n <= prefill_max) sizes.push_back(n);
  auto prompt_ids = [token_mod](int n) {
    std::vector<int32_t> ids;
    for (int i = 0; i < n; ++i) ids.push_back((i * 7919 + 17) % token_mod);
    return ids;
  };
  auto prefill_once = [&](const std::vector<int32_t>& ids) {
    KvSequence seq(pool, false);
    forward_sequence(*backend, seq, ids, false);
  };
  if (!sizes.empty()) prefill_once(prompt_ids(sizes.back()));
  std::printf("\nprefill (one chunk per prompt; cold experts staged in groups of %d through a ring of %d VRAM buffers, %.2f GiB;\n"
              "chunks of >= %d tokens route in two parts, the first part's experts copying during the second's attention)\n",
              opt.stage_group, stage_buffers, opt.stage_group * stage_buffers * block / 1073741824.0, opt.prefill_split_min_tokens);
  std::printf("%-10s %7s %10s %9s %12s %15s %9s\n", "mode", "tokens", "tok/s", "seconds", "staged GiB", "staging roof t/s", "achieved");
  // Rows: resident and offloaded, each with the default attention policy (the flash kernel) and
  // with cuBLAS attention (the score matrix materialised); offloaded also the default with long
  // chunks not split in two routing parts; in the same run for the ratios.
  struct Mode {
    int slots;
    const char* name;
    bool flash;
    int min_keys;
    int split_min = -1;  // -1: the option's default
  };
  const int dflt_keys = opt.flash_attention_min_keys;
  for (const Mode mode : {Mode{128, "resident", true, dflt_keys}, Mode{128, "res cuBLAS", false, 0}, Mode{0, "offloaded", true, dflt_keys},
                          Mode{0, "off cuBLAS", false, 0}, Mode{0, "off nosplit", true, dflt_keys, 0}}) {
    const int slots = mode.slots;
    backend->set_hot_slots(slots);
    backend->set_flash_attention(mode.flash, mode.min_keys);
    backend->set_prefill_split(mode.split_min < 0 ? opt.prefill_split_min_tokens : mode.split_min);
    if (!sizes.empty()) prefill_once(prompt_ids(2));  // (re)allocate the prefill buffers of this path outside the timed runs
    // First use of a cuBLAS shape costs tens of ms (a first mode measured 50% / 65% slower at
    // 512 / 4096 tokens than the same path later): warm the smaller sizes.
    for (int n : sizes)
      if (n < sizes.back()) prefill_once(prompt_ids(n));
    // The resident row, compared with transformers (median of 3 there too), is the median of 3
    // forwards; the others one each.
    const int reps = slots == 128 && mode.flash ? 3 : 1;
    for (int n : sizes) {
      const auto ids = prompt_ids(n);
      std::vector<double> secs;
      double staged = 0;
      for (int r = 0; r < reps; ++r) {
        KvSequence cache(pool, false);
        backend->reset_stats();
        auto tp = clk::now();
        forward_sequence(*backend, cache, ids, false);
        secs.push_back(seconds_since(tp));
        staged = static_cast<double>(backend->stats().staged_bytes);
      }
      std::sort(secs.begin(), secs.end());
      const double sec = secs[secs.size() / 2];
      const double roof_s = staged / (c.h2d_gbs * 1e9);
      if (slots == 128) {
        std::printf("%-10s %7d %10.1f %9.3f %12.2f %15s %9s\n", mode.name, n, n / sec, sec, staged / 1073741824.0, "-", "-");
      } else {
        std::printf("%-10s %7d %10.1f %9.3f %12.2f %15.1f %8.1f%%\n", mode.name, n, n / sec, sec, staged / 1073741824.0,
                    n / roof_s, 100 * roof_s / sec);
      }
      prows.push_back({{"hot_slots", slots}, {"attention", mode.name}, {"tokens", n}, {"prefill_tok_s", n / sec}, {"seconds", sec},
                       {"staged_bytes", staged}, {"staging_roofline_tok_s", staged > 0 ? n / roof_s : 0.0},
                       {"achieved_fraction", staged > 0 ? roof_s / sec : 0.0}});
    }
  }
  // E.g. cuBLAS refusing the grouped expert GEMMs (the prefill then runs one GEMM per expert).
  std::printf("backend warnings: %s\n", backend->warnings().empty() ? "none" : "");
  for (const std::string& w : backend->warnings()) std::printf("  %s\n", w.c_str());
  if (const char* out = std::getenv("OUT")) {
    nlohmann::json j = {{"device", prop.name}, {"h2d_gbs", c.h2d_gbs}, {"uva_gbs", c.uva_gbs}, {"hbm_gbs", c.hbm_gbs},
                        {"load_s", load_s}, {"expert_gib", expert_gib},
                        {"host_mapped_ratio", static_cast<double>(backend->host_bytes_mapped()) / backend->expert_bytes()},
                        {"rows", rows}, {"prefill_rows", prows}, {"synthetic_weights", true}, {"layers", layers}, {"experts", experts_name},
                        {"expert_block_bytes", backend->expert_block_bytes()}};
    std::ofstream(std::string(out) + "/bench_moe_offload.json") << j.dump(2) << "\n";
  }
  return 0;
}
