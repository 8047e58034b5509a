// bench_decode_attention: the decode step's attention over the paged bf16 KV pool
// (launch_attention_decode_paged) against context length, on the Qwen3-30B-A3B shape (32 query
// heads, 4 KV heads of 128, blocks of 16 positions). Each row is a CUDA graph of 48 PDL launches,
// one per layer, each layer with its own pool (12.9 GB at 128K positions), so the K/V rows come
// from HBM as in a decode step; "+ o-proj" rows add each layer's o-proj GEMV (2048 x 4096, distinct
// weights), which the step launches at the attention's start to stage its rows beside it.
// Reference: the HBM read ceiling measured in the same run (ceilings.hpp); the KV bytes a layer
// must read are ctx x 4 KV heads x 128 x 2 (K and V) x 2 bytes.
// Usage: bench_decode_attention [--contexts 256,1024,...]   (GPU machine)
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "bench/moe_offload/ceilings.hpp"
#include "bench/moe_offload/graph_timing.hpp"
#include "worker/cuda/cuda_check.hpp"
#include "worker/cuda/fused.cuh"

namespace cuda = servedeck::worker::cuda;
using bf16 = __nv_bfloat16;

namespace {

constexpr int k_layers = 48, k_heads = 32, k_kv_heads = 4, k_head_dim = 128, k_block = 16, k_hidden = 2048;
constexpr int k_q_dim = k_heads * k_head_dim, k_kv_dim = k_kv_heads * k_head_dim;

void* dalloc(std::size_t bytes, int fill) {
  void* p = nullptr;
  CUDA_CHECK(cudaMalloc(&p, bytes));
  CUDA_CHECK(cudaMemset(p, fill, bytes));
  return p;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> contexts = {256, 1024, 4096, 8192, 32768, 65536, 131072};
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--contexts") {
      contexts.clear();
      std::stringstream ss(v);
      std::string t;
      while (std::getline(ss, t, ',')) contexts.push_back(std::atoi(t.c_str()));
    } else {
      std::fprintf(stderr, "unknown option %s\n", a.c_str());
      return 2;
    }
  }
  const int max_ctx = *std::max_element(contexts.begin(), contexts.end());
  const servedeck::bench::Ceilings c = servedeck::bench::measure_ceilings();
  std::printf("device HBM read ceiling %.1f GB/s\n", c.hbm_gbs);

  cudaStream_t st;
  CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  const std::size_t pool_rows = static_cast<std::size_t>(max_ctx);
  std::vector<bf16*> kp(k_layers), vp(k_layers);
  for (int l = 0; l < k_layers; ++l) {
    kp[static_cast<std::size_t>(l)] = static_cast<bf16*>(dalloc(pool_rows * k_kv_dim * 2, 0x3c));
    vp[static_cast<std::size_t>(l)] = static_cast<bf16*>(dalloc(pool_rows * k_kv_dim * 2, 0x3c));
  }
  std::vector<int32_t> htab(static_cast<std::size_t>(max_ctx / k_block));
  for (std::size_t i = 0; i < htab.size(); ++i) htab[i] = static_cast<int32_t>(htab.size() - 1 - i);  // reversed: not one stream
  auto* table = static_cast<int32_t*>(dalloc(htab.size() * 4, 0));
  CUDA_CHECK(cudaMemcpy(table, htab.data(), htab.size() * 4, cudaMemcpyHostToDevice));
  auto* o_w = static_cast<bf16*>(dalloc(static_cast<std::size_t>(k_layers) * k_hidden * k_q_dim * 2, 0x3c));
  auto* qkv = static_cast<float*>(dalloc((k_q_dim + 2 * k_kv_dim) * 4, 0x3c));
  auto* nw = static_cast<bf16*>(dalloc(k_head_dim * 2, 0x3c));
  auto* attn = static_cast<float*>(dalloc(k_q_dim * 4, 0));
  auto* x = static_cast<float*>(dalloc(k_hidden * 4, 0));
  auto* pos = static_cast<int32_t*>(dalloc(4, 0));
  const std::vector<float> f = cuda::rope_inv_freq(1e6f, k_head_dim);
  auto* freq = static_cast<float*>(dalloc(f.size() * 4, 0));
  CUDA_CHECK(cudaMemcpy(freq, f.data(), f.size() * 4, cudaMemcpyHostToDevice));
  const int splits = cuda::attention_splits(k_kv_heads);
  auto* scratch = static_cast<float*>(dalloc(cuda::attention_scratch_floats(k_heads, k_head_dim, splits) * 4, 0));
  auto* counters = static_cast<unsigned int*>(dalloc(k_kv_heads * 4, 0));
  const cuda::AttentionShape shape{k_heads, k_kv_heads, k_head_dim, k_head_dim, 1e-6f, freq, splits, scratch, counters};
  const cuda::AttentionBlockConfig bc = cuda::attention_block_config(shape);
  std::printf("attention: %d blocks per KV head of %d warps, %d ring stages per warp\n", splits, bc.warps, bc.stages);

  // µs a layer: body(0..k_layers-1) as one graph, median of 7 launches after a warm-up.
  auto layer_us = [&](const std::function<void(int)>& body) { return servedeck::bench::graph_us_per_call(st, k_layers, body, 8); };
  auto attention = [&](int l) {
    cuda::launch_attention_decode_paged(qkv, nw, nw, cuda::PagedKv{kp[static_cast<std::size_t>(l)], vp[static_cast<std::size_t>(l)], table, k_block},
                                        attn, shape, pos, st, true);
  };
  auto oproj = [&](int l) {
    cuda::launch_gemv_bf16_pdl(o_w + static_cast<std::size_t>(l) * k_hidden * k_q_dim, attn, x, k_hidden, k_q_dim, true, st, true);
  };
  const double oproj_us = layer_us(oproj);
  std::printf("o-proj alone: %.2f us a layer (%.1f%% of HBM)\n", oproj_us, 100.0 * 2.0 * k_hidden * k_q_dim / oproj_us / 1e3 / c.hbm_gbs);
  std::printf("%8s %10s %10s %9s %8s %14s %12s\n", "context", "us/layer", "KV MB", "GB/s", "of HBM", "+o-proj us", "step ms x48");
  for (const int ctx : contexts) {
    const int32_t p = ctx - 1;  // attends over positions [0, ctx)
    CUDA_CHECK(cudaMemcpy(pos, &p, 4, cudaMemcpyHostToDevice));
    const double us = layer_us(attention);
    const double both = layer_us([&](int l) {
      attention(l);
      oproj(l);
    });
    const double mb = static_cast<double>(ctx) * k_kv_dim * 2 * 2 / 1e6;
    std::printf("%8d %10.2f %10.2f %9.0f %7.1f%% %14.2f %12.3f\n", ctx, us, mb, mb / us * 1e3, 100.0 * mb / us * 1e3 / c.hbm_gbs, both,
                both * k_layers / 1e3);
  }
  CUDA_CHECK(cudaStreamSynchronize(st));
  return 0;
}
