#include "worker/cuda/cuda_backend.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>

#include "worker/cuda/backend_impl.cuh"
#include "worker/cuda/cuda_check.hpp"
#include "worker/cuda/fused.cuh"
#include "worker/cuda/kernels.cuh"
#include "worker/cuda/quant_moe.cuh"
#include "worker/offload/expert_store.hpp"

// The CUDA backend at run time: the decode step (a captured graph of fused kernels), forward(),
// caches, statistics and the benchmark hooks; loading is in cuda_backend_load.cu, the prefill
// path in prefill_path.cu.

namespace servedeck::worker::cuda {

using bf16 = __nv_bfloat16;
using detail::LayerDev;

int CudaBackend::Impl::rotary_dim() const { return static_cast<int>(d.rotary_dim()); }

AttentionShape CudaBackend::Impl::attention_shape() const {
  return AttentionShape{static_cast<int>(d.num_heads), static_cast<int>(d.num_kv_heads), static_cast<int>(d.head_dim),
                        rotary_dim(), static_cast<float>(d.rms_norm_eps), inv_freq, attn_splits,
                        attn_scratch, attn_counters};
}

void* CudaBackend::Impl::device_alloc(std::size_t bytes) {
  void* p = nullptr;
  CUDA_CHECK(cudaMalloc(&p, bytes));
  ++allocations;
  return p;
}

void* CudaBackend::Impl::host_alloc(std::size_t bytes, unsigned flags) {
  void* p = nullptr;
  CUDA_CHECK(cudaHostAlloc(&p, bytes, flags));
  ++allocations;
  return p;
}

PagedKv CudaBackend::Impl::layer_kv(int l) const {
  const std::size_t rows = pool.tokens() * static_cast<std::size_t>(kv_dim());
  return PagedKv{kv_pool + static_cast<std::size_t>(2 * l) * rows, kv_pool + static_cast<std::size_t>(2 * l + 1) * rows, d_table,
                 static_cast<int>(pool.block_tokens)};
}

void CudaBackend::Impl::allocate_pool(const KvPoolShape& shape) {
  if (shape.num_blocks == 0 || shape.block_tokens == 0 || shape.block_tokens % 16 != 0 || shape.num_blocks > (1u << 30))
    throw std::invalid_argument("KV pool of " + std::to_string(shape.num_blocks) + " blocks of " + std::to_string(shape.block_tokens) +
                                " tokens: the CUDA backend needs at least one block (at most 2^30) of a positive multiple of 16 tokens");
  CUDA_CHECK(cudaStreamSynchronize(stream));
  CUDA_CHECK(cudaStreamSynchronize(copy_stream));
  if (graph) CUDA_CHECK(cudaGraphExecDestroy(graph));
  graph = nullptr;
  last_pos = -1;
  if (kv_pool) CUDA_CHECK(cudaFree(kv_pool));
  if (d_table) CUDA_CHECK(cudaFree(d_table));
  if (h_table) CUDA_CHECK(cudaFreeHost(h_table));
  kv_pool = nullptr;
  d_table = h_table = nullptr;
  pool = KvPoolShape{};
  table_len = 0;
  const std::size_t bytes = shape.tokens() * static_cast<std::size_t>(d.num_layers) * 2 * static_cast<std::size_t>(kv_dim()) * sizeof(bf16);
  kv_pool = static_cast<bf16*>(device_alloc(bytes));
  CUDA_CHECK(cudaMemset(kv_pool, 0, bytes));  // rows no pass wrote read as zeros, never as NaN
  d_table = static_cast<int32_t*>(device_alloc(shape.num_blocks * sizeof(int32_t)));
  h_table = static_cast<int32_t*>(host_alloc(shape.num_blocks * sizeof(int32_t)));
  pool = shape;
  ++pool_allocations;
  ensure_prefill_buffers(std::max(1, opt.prefill_chunk), shape.tokens());
}

void CudaBackend::Impl::use_table(const KvView& kv, std::size_t n) {
  if (!kv_pool) throw std::logic_error("forward before allocate_kv_pool: the CUDA backend has no KV pool yet");
  const std::size_t B = pool.block_tokens, room = kv.blocks.size() * B;
  if (kv.length + n > room)
    throw KvCacheFull("KV cache full: " + std::to_string(kv.length) + " cached + " + std::to_string(n) + " new tokens = " +
                      std::to_string(kv.length + n) + " exceeds the sequence's " + std::to_string(kv.blocks.size()) + " blocks of " +
                      std::to_string(B) + " tokens");
  const std::size_t need = (kv.length + n + B - 1) / B;  // the blocks this pass reads or writes
  if (need > pool.num_blocks)
    throw std::out_of_range("a block table of " + std::to_string(need) + " blocks for a pool of " + std::to_string(pool.num_blocks));
  // Entries equal to the last upload stay (they were checked then); the first that differs and
  // every entry after it are checked and uploaded.
  std::size_t from = 0;
  const std::size_t same = std::min(need, table_len);
  while (from < same && h_table[from] == kv.blocks[from]) ++from;
  if (from == need) return;
  for (std::size_t i = from; i < need; ++i) {
    const int32_t b = kv.blocks[i];
    if (b < 0 || static_cast<std::size_t>(b) >= pool.num_blocks)
      throw std::out_of_range("block id " + std::to_string(b) + " outside the KV pool of " + std::to_string(pool.num_blocks) + " blocks");
  }
  // The mirror is rewritten only when no copy from it is in flight: every forward ends with a
  // synchronisation of the stream.
  std::copy(kv.blocks.begin() + static_cast<std::ptrdiff_t>(from), kv.blocks.begin() + static_cast<std::ptrdiff_t>(need), h_table + from);
  CUDA_CHECK(cudaMemcpyAsync(d_table + from, h_table + from, (need - from) * sizeof(int32_t), cudaMemcpyHostToDevice, stream));
  table_len = std::max(table_len, need);
}

const __nv_bfloat16* CudaBackend::Impl::place(const std::vector<uint16_t>& host) {
  const std::size_t bytes = host.size() * 2, at = (arena_used + 255) / 256 * 256;
  if (at + bytes > arena_bytes) throw std::logic_error("cuda backend: resident arena overflow");
  CUDA_CHECK(cudaMemcpy(arena + at, host.data(), bytes, cudaMemcpyHostToDevice));
  arena_used = at + bytes;
  return reinterpret_cast<const bf16*>(arena + at);
}

const float* CudaBackend::Impl::place_f32(const std::vector<float>& host) {
  const std::size_t bytes = host.size() * 4, at = (arena_used + 255) / 256 * 256;
  if (at + bytes > arena_bytes) throw std::logic_error("cuda backend: resident arena overflow");
  CUDA_CHECK(cudaMemcpy(arena + at, host.data(), bytes, cudaMemcpyHostToDevice));
  arena_used = at + bytes;
  return reinterpret_cast<const float*>(arena + at);
}

std::size_t CudaBackend::Impl::resident_elems() const {
  std::size_t n = static_cast<std::size_t>(d.vocab_size) * hidden() * (d.tie_word_embeddings ? 1 : 2) + hidden();
  for (const auto& l : d.layers) {
    n += 2 * static_cast<std::size_t>(hidden()) + 2 * static_cast<std::size_t>(d.head_dim);
    n += static_cast<std::size_t>(hidden()) * (2 * q_dim() + 2 * kv_dim());
    if (d.attention_bias) n += 2 * static_cast<std::size_t>(qkv_dim());  // fp32: two bf16 slots each
    if (l.mlp == MlpKind::moe) {
      n += static_cast<std::size_t>(d.moe.num_experts) * hidden();
      if (d.moe.router == RouterKind::sigmoid_bias_topk) n += 2 * static_cast<std::size_t>(d.moe.num_experts);
      n += 3 * static_cast<std::size_t>(shared_inter()) * hidden();
    } else {
      n += 3 * static_cast<std::size_t>(d.intermediate_size) * hidden();
    }
  }
  return n + 256 * (16 * d.layers.size() + 8);  // alignment slack
}

void CudaBackend::Impl::allocate_activations() {
  const std::size_t H = static_cast<std::size_t>(hidden());
  const std::size_t topk = static_cast<std::size_t>(std::max<int64_t>(d.moe.top_k, 1));
  const std::size_t inter = static_cast<std::size_t>(std::max<int64_t>(d.moe.intermediate_size, 8));
  const std::size_t dense = static_cast<std::size_t>(std::max<int64_t>(d.intermediate_size, 8));
  auto f = [&](float** p, std::size_t n) { *p = static_cast<float*>(device_alloc(n * sizeof(float))); };
  auto dev = [&](auto** p, std::size_t bytes) { *p = static_cast<std::remove_reference_t<decltype(*p)>>(device_alloc(bytes)); };
  f(&x, H); f(&x_alt, H); f(&xn, H); f(&qkv, static_cast<std::size_t>(qkv_dim())); f(&attn, static_cast<std::size_t>(q_dim()));
  f(&router_logits, static_cast<std::size_t>(std::max<int64_t>(d.moe.num_experts, 1)));
  f(&route_w, topk); f(&act, topk * inter);
  f(&g, dense); f(&u, dense); f(&h, dense); f(&logits, static_cast<std::size_t>(d.vocab_size));
  if (shared_inter() > 0) {
    f(&shared_gu, 2 * static_cast<std::size_t>(shared_inter()));
    f(&shared_act, static_cast<std::size_t>(shared_inter()));
  }
  dev(&route_ids, topk * sizeof(int32_t));
  // Token and position side by side: one host→device copy per decode step.
  dev(&d_token, 2 * sizeof(int32_t));
  d_pos = d_token + 1;
  const std::size_t n_moe = store ? static_cast<std::size_t>(store->n_layers()) : 0;
  dev(&step_counters, (2 + 2 * n_moe) * sizeof(unsigned int));
  CUDA_CHECK(cudaMemset(step_counters, 0, (2 + 2 * n_moe) * sizeof(unsigned int)));
  router_done = step_counters + 1;
  dev(&counters, 2 * sizeof(unsigned long long));
  CUDA_CHECK(cudaMemset(counters, 0, 2 * sizeof(unsigned long long)));
  const std::size_t lc = std::max<std::size_t>(1, d.layers.size() * static_cast<std::size_t>(std::max<int64_t>(d.moe.num_experts, 1)));
  dev(&layer_counts, lc * sizeof(unsigned long long));
  CUDA_CHECK(cudaMemset(layer_counts, 0, lc * sizeof(unsigned long long)));
  attn_splits = attention_splits(static_cast<int>(d.num_kv_heads));
  f(&attn_scratch, attention_scratch_floats(static_cast<int>(d.num_heads), static_cast<int>(d.head_dim), attn_splits));
  dev(&attn_counters, static_cast<std::size_t>(d.num_heads) * sizeof(unsigned int));
  CUDA_CHECK(cudaMemset(attn_counters, 0, static_cast<std::size_t>(d.num_heads) * sizeof(unsigned int)));
  // The CPU backend's table (ModelDescription::rope_inv_freq: plain, or YaRN-blended), as is; the
  // YaRN attention factor is in the weights (LayerDev).
  std::vector<float> freq = d.rope_inv_freq();
  if (freq.empty()) freq.assign(1, 0.f);
  f(&inv_freq, freq.size());
  CUDA_CHECK(cudaMemcpy(inv_freq, freq.data(), freq.size() * sizeof(float), cudaMemcpyHostToDevice));
  h_scalars = static_cast<int32_t*>(host_alloc(3 * sizeof(int32_t)));
  dev(&d_pick, sizeof(int32_t));
  dev(&argmax_scratch.values, k_argmax_blocks * sizeof(float));
  dev(&argmax_scratch.indices, k_argmax_blocks * sizeof(int32_t));
  dev(&argmax_scratch.counter, sizeof(unsigned int));
  CUDA_CHECK(cudaMemset(argmax_scratch.counter, 0, sizeof(unsigned int)));
  // Also forward_top_k's landing place: at least its one copy's bytes, for a tiny vocabulary.
  h_logits = static_cast<float*>(host_alloc(std::max(static_cast<std::size_t>(d.vocab_size) * sizeof(float), top_k_out_bytes())));
  dev(&top_k_partial, static_cast<std::size_t>(top_k_blocks(static_cast<int>(d.vocab_size))) * k_max_device_top_k *
                          sizeof(unsigned long long));
  dev(&top_k_out.logits, top_k_out_bytes());
  top_k_out.ids = reinterpret_cast<int32_t*>(top_k_out.logits + k_max_device_top_k);
  top_k_out.count = reinterpret_cast<int*>(top_k_out.ids + k_max_device_top_k);
}

StepSync CudaBackend::Impl::step_sync(int si) const {
  const std::size_t n_moe = store ? static_cast<std::size_t>(store->n_layers()) : 0;
  return StepSync{step_counters, step_counters + 2 + static_cast<std::size_t>(si), step_counters + 2 + n_moe + static_cast<std::size_t>(si)};
}

// Six launches per MoE layer (fused.cuh): norm+qkv, attention (q/k-norm, RoPE, KV append),
// o-proj + residual, router, gate/up+SwiGLU, down+reduction+residual. A MoE layer whose router is
// folded (L.router_folded, fold_routers at load) writes the o-proj's sum into the residual
// stream's other buffer, so the router can read the residual before it, and runs the handshakes
// H2-H4 (handshakes.cuh); otherwise the unfolded router follows the o-proj in PDL order.
// glm4_moe: the q|k|v GEMV adds the bias, the sigmoid router (router_sigmoid.cuh) is never
// folded, and the shared expert adds three launches after the down (gate|up GEMV, SwiGLU, down
// GEMV into the residual).
void CudaBackend::Impl::step() {
  const int H = hidden();
  const float eps = static_cast<float>(d.rms_norm_eps);
  const AttentionShape shape = attention_shape();
  const bool pdl = opt.use_pdl;
  launch_embed(embed, d_token, x, H, stream);
  float* xin = x;  // the residual stream entering the layer
  for (std::size_t li = 0; li < layers.size(); ++li) {
    const LayerDev& L = layers[li];
    const int l = static_cast<int>(li);
    const bool fold = L.moe && L.router_folded != nullptr;
    const int si = moe_index[li];
    const StepSync sync = L.moe ? step_sync(si) : StepSync{};
    launch_norm_gemv_bf16(L.qkv, xin, L.input_norm, eps, qkv, qkv_dim(), H, false, nullptr, stream, pdl, L.qkv_bias);
    launch_attention_decode_paged(qkv, L.q_norm, L.k_norm, layer_kv(l), attn, shape, d_pos, stream, pdl,
                                  fold ? sync.heads_done : nullptr);
    float* xout = fold ? (xin == x ? x_alt : x) : xin;
    launch_gemv_bf16_pdl(L.o, attn, xout, H, q_dim(), true, stream, pdl, fold ? xin : nullptr, fold);
    if (L.moe) {
      const int E = static_cast<int>(d.moe.num_experts), K = static_cast<int>(d.moe.top_k);
      const RouterOutputs ro{router_logits, route_ids, route_w, router_done,
                             store->device_hot_flags() + static_cast<std::size_t>(si) * E, counters,
                             layer_counts + static_cast<std::size_t>(si) * E};
      // The unfolded router: post-attention norm (into xn) + router GEMV + the pick.
      auto route = [&] {
        if (d.moe.router == RouterKind::sigmoid_bias_topk)
          launch_router_sigmoid_fused(L.router, xout, L.post_norm, eps, xn, E, H, K, sigmoid_router(L), ro, stream, pdl);
        else
          launch_router_fused(L.router, xout, L.post_norm, eps, xn, E, H, K, d.moe.norm_topk_prob, ro, stream, pdl);
      };
      if (fold) {
        // Every format: the folded router, then gate/up ranking its logits (quantised experts
        // dequantised in its registers).
        launch_router_folded(L.router_folded, xin, attn, E, H, q_dim(), router_logits, sync, static_cast<int>(d.num_heads), stream, pdl);
        launch_moe_gate_up_normed(store->table(si), xout, L.post_norm, eps, E, K, d.moe.norm_topk_prob, ro, sync, act, stream, pdl);
        if (store->format() != ExpertFormat::bf16)
          launch_moe_down_quant(store->table(si), act, route_ids, route_w, K, xout, stream, pdl);
        else
          launch_moe_down_fused(store->table(si), act, route_ids, route_w, K, xout, stream, pdl);
      } else if (store->format() != ExpertFormat::bf16) {
        // Quantised experts under an unfolded router: gate/up and the down dequantising in
        // registers (quant_moe.cuh).
        route();
        launch_moe_gate_up_quant(store->table(si), xn, route_ids, K, act, stream, pdl);
        launch_moe_down_quant(store->table(si), act, route_ids, route_w, K, xout, stream, pdl);
      } else {
        route();
        launch_moe_gate_up_fused(store->table(si), xn, route_ids, K, act, stream, pdl);
        launch_moe_down_fused(store->table(si), act, route_ids, route_w, K, xout, stream, pdl);
      }
      // glm4_moe's shared expert on the unfolded router's xn (the sigmoid router never folds).
      shared_expert_decode(L, xn, xout);
    } else {
      const int I = static_cast<int>(d.intermediate_size);
      launch_norm_gemv_bf16(L.mlp_gate, xout, L.post_norm, eps, g, I, H, false, nullptr, stream);
      launch_norm_gemv_bf16(L.mlp_up, xout, L.post_norm, eps, u, I, H, false, nullptr, stream);
      launch_swiglu(g, u, h, I, stream);
      launch_gemv_bf16(L.mlp_down, h, xout, H, I, true, stream);
    }
    xin = xout;
  }
  // Final norm + lm_head inside the step (and its graph): logits of the token just decoded.
  launch_norm_gemv_bf16(lm_head, xin, final_norm, eps, logits, static_cast<int>(d.vocab_size), H, false, nullptr, stream, pdl);
  // The greedy pick too (~3 µs): forward_greedy copies back only it. As the step's last kernel it
  // advances the step's epoch (handshakes.cuh).
  launch_argmax_row(logits, static_cast<int>(d.vocab_size), argmax_scratch, d_pick, stream, pdl, step_counters);
}

void CudaBackend::Impl::run_token(int32_t token, std::size_t pos) {
  h_scalars[0] = last_token = token;
  h_scalars[1] = last_pos = static_cast<int32_t>(pos);
  CUDA_CHECK(cudaMemcpyAsync(d_token, h_scalars, 2 * sizeof(int32_t), cudaMemcpyHostToDevice, stream));
  if (opt.use_graphs) {
    if (!graph) {
      cudaGraph_t g_new;
      CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
      step();
      CUDA_CHECK(cudaStreamEndCapture(stream, &g_new));
      CUDA_CHECK(cudaGraphInstantiate(&graph, g_new, 0));
      CUDA_CHECK(cudaGraphDestroy(g_new));
      ++graph_captures;
    }
    CUDA_CHECK(cudaGraphLaunch(graph, stream));
  } else {
    step();
  }
}

void CudaBackend::Impl::logits_row(const float* x_row, std::vector<float>& out) {
  const std::size_t V = static_cast<std::size_t>(d.vocab_size);
  launch_norm_gemv_bf16(lm_head, x_row, final_norm, static_cast<float>(d.rms_norm_eps), logits, static_cast<int>(V),
                        hidden(), false, nullptr, stream);
  CUDA_CHECK(cudaMemcpyAsync(h_logits, logits, V * sizeof(float), cudaMemcpyDeviceToHost, stream));
  CUDA_CHECK(cudaStreamSynchronize(stream));
  out.insert(out.end(), h_logits, h_logits + V);
}

CudaBackend::CudaBackend(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

CudaBackend::~CudaBackend() {
  if (!impl_) return;
  Impl& m = *impl_;
  if (!m.opt.capture_profile_path.empty() && m.store) {
    try {
      const int E = static_cast<int>(m.d.moe.num_experts);
      std::vector<unsigned long long> counts(static_cast<std::size_t>(m.store->n_layers()) * E);
      // The step's stream first (non-blocking: the legacy-stream copy does not wait for it); a
      // failed copy writes nothing rather than zeros.
      CUDA_CHECK(cudaStreamSynchronize(m.stream));
      CUDA_CHECK(cudaMemcpy(counts.data(), m.layer_counts, counts.size() * sizeof(unsigned long long), cudaMemcpyDeviceToHost));
      offload::ExpertProfile p;
      p.layout = offload::expert_profile_layout(m.store->n_layers(), E);
      for (int l = 0; l < m.store->n_layers(); ++l)
        p.counts.emplace_back(counts.begin() + static_cast<std::ptrdiff_t>(l) * E, counts.begin() + static_cast<std::ptrdiff_t>(l + 1) * E);
      // The profile this run was filled from, when it is the file captured to: add to it.
      if (m.have_profile && m.opt.profile_path == m.opt.capture_profile_path) p = offload::accumulate_expert_profile(m.profile, p);
      offload::write_expert_profile(p, m.opt.capture_profile_path);
    } catch (const std::exception& e) {
      // Destructors do not throw; the profile is not written, and stderr (the worker's log) says why.
      std::fprintf(stderr, "servedeck-worker: hot-expert profile not written: %s\n", e.what());
    } catch (...) {
      std::fprintf(stderr, "servedeck-worker: hot-expert profile not written\n");
    }
  }
  m.store.reset();
  if (m.graph) cudaGraphExecDestroy(m.graph);
  if (m.h_table) cudaFreeHost(m.h_table);
  for (void* p : {static_cast<void*>(m.kv_pool), static_cast<void*>(m.d_table), static_cast<void*>(m.arena), static_cast<void*>(m.x), static_cast<void*>(m.x_alt), static_cast<void*>(m.router_folded), static_cast<void*>(m.xn), static_cast<void*>(m.qkv),
                  static_cast<void*>(m.attn), static_cast<void*>(m.router_logits), static_cast<void*>(m.route_w),
                  static_cast<void*>(m.act), static_cast<void*>(m.step_counters), static_cast<void*>(m.d_pick),
                  static_cast<void*>(m.argmax_scratch.values), static_cast<void*>(m.argmax_scratch.indices),
                  static_cast<void*>(m.argmax_scratch.counter), static_cast<void*>(m.inv_freq), static_cast<void*>(m.attn_scratch), static_cast<void*>(m.attn_counters), static_cast<void*>(m.shared_gu), static_cast<void*>(m.shared_act), static_cast<void*>(m.g), static_cast<void*>(m.u), static_cast<void*>(m.h),
                  static_cast<void*>(m.logits), static_cast<void*>(m.route_ids), static_cast<void*>(m.d_token),
                  static_cast<void*>(m.counters), static_cast<void*>(m.layer_counts)})
    if (p) cudaFree(p);
  if (m.h_scalars) cudaFreeHost(m.h_scalars);
  if (m.h_logits) cudaFreeHost(m.h_logits);
  for (cudaEvent_t e : m.stage_ready)
    if (e) cudaEventDestroy(e);
  for (cudaEvent_t e : m.stage_free)
    if (e) cudaEventDestroy(e);
  for (cudaEvent_t e : m.ids_ready)
    if (e) cudaEventDestroy(e);
  if (m.cublas) cublasDestroy(m.cublas);
  if (m.copy_stream) cudaStreamDestroy(m.copy_stream);
  if (m.stream) cudaStreamDestroy(m.stream);
}

std::size_t CudaBackend::vocab_size() const { return static_cast<std::size_t>(impl_->d.vocab_size); }
std::size_t CudaBackend::kv_bytes_per_token() const {
  return static_cast<std::size_t>(impl_->d.num_layers) * 2 * static_cast<std::size_t>(impl_->kv_dim()) * sizeof(bf16);
}
void CudaBackend::allocate_kv_pool(const KvPoolShape& shape) { impl_->allocate_pool(shape); }
std::size_t CudaBackend::kv_pool_allocations() const { return impl_->pool_allocations; }
std::size_t CudaBackend::allocations() const { return impl_->allocations; }
std::size_t CudaBackend::graph_captures() const { return impl_->graph_captures; }
const ModelDescription& CudaBackend::description() const { return impl_->d; }
const std::vector<std::string>& CudaBackend::warnings() const { return impl_->warnings; }
std::size_t CudaBackend::expert_block_bytes() const { return impl_->store ? impl_->store->block_bytes() : 0; }
ExpertFormat CudaBackend::expert_format() const { return impl_->store ? impl_->store->format() : ExpertFormat::bf16; }
std::size_t CudaBackend::resident_bytes() const { return impl_->arena_used; }
std::size_t CudaBackend::host_bytes_mapped() const { return impl_->store ? impl_->store->host_bytes_mapped() : 0; }
std::size_t CudaBackend::expert_bytes() const { return impl_->store ? impl_->store->expert_bytes() : 0; }
int CudaBackend::hot_slots() const { return impl_->store ? impl_->store->slots() : 0; }

double CudaBackend::decode_step_us(int reps) {
  Impl& m = *impl_;
  if (!m.graph || m.last_pos < 0 || reps <= 0)
    throw std::logic_error("decode_step_us: no decode step ran since the graph was captured (or reps <= 0)");
  // The graph reads the token/position words: point them back at the last step (its KV row is
  // rewritten with the same values).
  CUDA_CHECK(cudaStreamSynchronize(m.stream));
  m.h_scalars[0] = m.last_token;
  m.h_scalars[1] = m.last_pos;
  CUDA_CHECK(cudaMemcpyAsync(m.d_token, m.h_scalars, 2 * sizeof(int32_t), cudaMemcpyHostToDevice, m.stream));
  // The replays route tokens too: keep the hit/miss and per-layer routing counters as they were.
  const int E = static_cast<int>(std::max<int64_t>(m.d.moe.num_experts, 1));
  const std::size_t n_counts = std::max<std::size_t>(1, m.d.layers.size() * static_cast<std::size_t>(E));
  std::vector<unsigned long long> saved(2 + n_counts);
  CUDA_CHECK(cudaMemcpyAsync(saved.data(), m.counters, 2 * sizeof(unsigned long long), cudaMemcpyDeviceToHost, m.stream));
  CUDA_CHECK(cudaMemcpyAsync(saved.data() + 2, m.layer_counts, n_counts * sizeof(unsigned long long), cudaMemcpyDeviceToHost, m.stream));
  cudaEvent_t ev[2] = {nullptr, nullptr};
  std::vector<double> us;
  try {
    CUDA_CHECK(cudaEventCreate(&ev[0]));
    CUDA_CHECK(cudaEventCreate(&ev[1]));
    for (int r = 0; r < 6; ++r) {
      CUDA_CHECK(cudaEventRecord(ev[0], m.stream));
      for (int i = 0; i < reps; ++i) CUDA_CHECK(cudaGraphLaunch(m.graph, m.stream));
      CUDA_CHECK(cudaEventRecord(ev[1], m.stream));
      CUDA_CHECK(cudaEventSynchronize(ev[1]));
      float ms = 0;
      CUDA_CHECK(cudaEventElapsedTime(&ms, ev[0], ev[1]));
      if (r > 0) us.push_back(1000.0 * ms / reps);
    }
    CUDA_CHECK(cudaMemcpyAsync(m.counters, saved.data(), 2 * sizeof(unsigned long long), cudaMemcpyHostToDevice, m.stream));
    CUDA_CHECK(cudaMemcpyAsync(m.layer_counts, saved.data() + 2, n_counts * sizeof(unsigned long long), cudaMemcpyHostToDevice, m.stream));
    CUDA_CHECK(cudaStreamSynchronize(m.stream));
  } catch (...) {
    for (cudaEvent_t e : ev)
      if (e) cudaEventDestroy(e);
    throw;
  }
  for (cudaEvent_t e : ev) CUDA_CHECK(cudaEventDestroy(e));
  std::sort(us.begin(), us.end());
  return us[us.size() / 2];
}

void CudaBackend::set_use_pdl(bool on) {
  Impl& m = *impl_;
  if (m.opt.use_pdl == on) return;
  CUDA_CHECK(cudaStreamSynchronize(m.stream));
  m.opt.use_pdl = on;
  if (m.graph) CUDA_CHECK(cudaGraphExecDestroy(m.graph));
  m.graph = nullptr;
  m.last_pos = -1;
}
void CudaBackend::set_flash_attention(bool on, int min_keys) {
  CUDA_CHECK(cudaStreamSynchronize(impl_->stream));
  impl_->opt.flash_attention = on;
  impl_->opt.flash_attention_min_keys = min_keys;
}

void CudaBackend::set_prefill_split(int min_tokens) {
  if (min_tokens < 0)
    throw std::invalid_argument("set_prefill_split: min_tokens must be >= 0 (0: never split), got " + std::to_string(min_tokens));
  CUDA_CHECK(cudaStreamSynchronize(impl_->stream));
  impl_->opt.prefill_split_min_tokens = min_tokens;
}

void CudaBackend::set_hot_slots(int slots) {
  if (!impl_->store) return;
  CUDA_CHECK(cudaStreamSynchronize(impl_->stream));
  impl_->store->fill_hot_cache(slots, impl_->have_profile ? &impl_->profile : nullptr, &impl_->warnings);
}

RoutingStats CudaBackend::stats() {
  CUDA_CHECK(cudaStreamSynchronize(impl_->stream));
  unsigned long long c[2] = {0, 0};
  CUDA_CHECK(cudaMemcpy(c, impl_->counters, sizeof c, cudaMemcpyDeviceToHost));
  RoutingStats s;
  s.hot_hits = c[0];
  s.misses = c[1];
  s.staged_bytes = impl_->staged_bytes;
  return s;
}

void CudaBackend::reset_stats() {
  CUDA_CHECK(cudaStreamSynchronize(impl_->stream));
  CUDA_CHECK(cudaMemset(impl_->counters, 0, 2 * sizeof(unsigned long long)));
  impl_->staged_bytes = 0;
}

namespace {

// forward's and forward_greedy's token check: std::out_of_range for a token outside the
// vocabulary of V.
void check_tokens(std::span<const int32_t> tokens, std::size_t V) {
  for (const int32_t t : tokens)
    if (t < 0 || static_cast<std::size_t>(t) >= V)
      throw std::out_of_range("token id " + std::to_string(t) + " outside the vocabulary of " + std::to_string(V));
}

}  // namespace

int32_t CudaBackend::forward_greedy(const KvView& kv, int32_t token) {
  Impl& m = *impl_;
  const int32_t one[1] = {token};
  check_tokens(one, static_cast<std::size_t>(m.d.vocab_size));
  m.use_table(kv, 1);
  m.run_token(token, kv.length);
  CUDA_CHECK(cudaMemcpyAsync(m.h_scalars + 2, m.d_pick, sizeof(int32_t), cudaMemcpyDeviceToHost, m.stream));
  CUDA_CHECK(cudaStreamSynchronize(m.stream));
  return m.h_scalars[2];
}

int CudaBackend::max_top_k() const {
  return std::min(k_max_device_top_k, 4096 / top_k_blocks(static_cast<int>(impl_->d.vocab_size)));
}

Backend::TopLogits CudaBackend::forward_top_k(const KvView& kv, int32_t token, int k) {
  Impl& m = *impl_;
  if (k < 1 || k > max_top_k())
    throw std::invalid_argument("forward_top_k: k must be in [1, " + std::to_string(max_top_k()) + "], got " + std::to_string(k));
  const int32_t one[1] = {token};
  check_tokens(one, static_cast<std::size_t>(m.d.vocab_size));
  m.use_table(kv, 1);
  m.run_token(token, kv.length);
  launch_top_k_row(m.logits, static_cast<int>(m.d.vocab_size), k, m.top_k_partial, m.top_k_out, m.stream);
  // The pick (the graph's argmax) and the selection into the pinned row buffer, in one sync.
  CUDA_CHECK(cudaMemcpyAsync(m.h_scalars + 2, m.d_pick, sizeof(int32_t), cudaMemcpyDeviceToHost, m.stream));
  CUDA_CHECK(cudaMemcpyAsync(m.h_logits, m.top_k_out.logits, Impl::top_k_out_bytes(), cudaMemcpyDeviceToHost, m.stream));
  CUDA_CHECK(cudaStreamSynchronize(m.stream));
  const float* logits = m.h_logits;
  const auto* ids = reinterpret_cast<const int32_t*>(logits + k_max_device_top_k);
  const int count = *reinterpret_cast<const int*>(ids + k_max_device_top_k);
  TopLogits out;
  out.argmax = m.h_scalars[2];
  out.best.reserve(static_cast<std::size_t>(count));
  for (int i = 0; i < count && i < k; ++i) out.best.emplace_back(logits[i], ids[i]);
  return out;
}

std::vector<float> CudaBackend::forward(const KvView& kv, std::span<const int32_t> tokens, bool all_logits) {
  Impl& m = *impl_;
  const std::size_t V = static_cast<std::size_t>(m.d.vocab_size);
  check_tokens(tokens, V);
  m.use_table(kv, tokens.size());
  std::vector<float> out;
  out.reserve(all_logits ? V * tokens.size() : V);
  if (tokens.size() > 1 && m.opt.staged_prefill) {
    m.prefill(kv.length, tokens, all_logits, out);
    return out;
  }
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    m.run_token(tokens[i], kv.length + i);
    const bool want = all_logits || i + 1 == tokens.size();
    if (want) {
      // The step computed this token's logits already (final norm + lm_head in the graph).
      CUDA_CHECK(cudaMemcpyAsync(m.h_logits, m.logits, V * sizeof(float), cudaMemcpyDeviceToHost, m.stream));
      CUDA_CHECK(cudaStreamSynchronize(m.stream));
      out.insert(out.end(), m.h_logits, m.h_logits + V);
    } else {
      // The scalars' pinned buffer is rewritten next token: the copies must have consumed it.
      CUDA_CHECK(cudaStreamSynchronize(m.stream));
    }
  }
  CUDA_CHECK(cudaStreamSynchronize(m.stream));  // the table's mirror may be rewritten by the next pass
  return out;
}

bool cuda_device_available() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

}  // namespace servedeck::worker::cuda
