#include "worker/cuda/cuda_backend.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <stdexcept>
#include <thread>

#include "worker/cuda/backend_impl.cuh"
#include "worker/cuda/cuda_check.hpp"
#include "worker/cuda/fused.cuh"
#include "worker/cuda/kernels.cuh"
#include "worker/offload/expert_store.hpp"

namespace servedeck::worker::cuda {

namespace {

using bf16 = __nv_bfloat16;

uint16_t f32_to_bf16_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);                      // round to nearest even
  return static_cast<uint16_t>(u >> 16);
}

float f16_bits_to_f32(uint16_t h) {
  const uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  uint32_t u;
  if (exp == 0) {
    if (mant == 0) {
      u = sign;
    } else {  // subnormal
      float f = std::ldexp(static_cast<float>(mant), -24);
      std::memcpy(&u, &f, 4);
      u |= sign;
    }
  } else if (exp == 31) {
    u = sign | 0x7f800000u | (mant << 13);
  } else {
    u = sign | ((exp + 112) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

/// Converts a checkpoint tensor to bf16 into `dst` (element count must match).
void to_bf16(const TensorRef& t, uint16_t* dst, std::size_t count) {
  if (!t.info) throw std::runtime_error("cuda backend: missing tensor");
  if (t.info->element_count() != count)
    throw std::runtime_error("cuda backend: tensor '" + t.info->name + "' has " + std::to_string(t.info->element_count()) +
                             " elements, expected " + std::to_string(count));
  const std::byte* src = t.bytes.data();
  switch (t.info->dtype) {
    case Dtype::bf16: std::memcpy(dst, src, count * 2); break;
    case Dtype::f16:
      for (std::size_t i = 0; i < count; ++i) {
        uint16_t h;
        std::memcpy(&h, src + 2 * i, 2);
        dst[i] = f32_to_bf16_bits(f16_bits_to_f32(h));
      }
      break;
    case Dtype::f32:
      for (std::size_t i = 0; i < count; ++i) {
        float f;
        std::memcpy(&f, src + 4 * i, 4);
        dst[i] = f32_to_bf16_bits(f);
      }
      break;
  }
}

/// Deterministic uniform bf16 in [-scale, scale] (splitmix64), for synthetic weights.
void fill_random(uint16_t* dst, std::size_t count, uint64_t seed, float scale) {
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  for (std::size_t i = 0; i < count; ++i) {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    const float u = static_cast<float>(z >> 40) / static_cast<float>(1ull << 24);  // [0, 1)
    dst[i] = f32_to_bf16_bits((2.f * u - 1.f) * scale);
  }
}

}  // namespace

using detail::CudaKvCache;
using detail::LayerDev;

int CudaBackend::Impl::rotary_dim() const {
  return static_cast<int>(std::lround(d.rotary_fraction * static_cast<double>(d.head_dim))) / 2 * 2;
}

AttentionShape CudaBackend::Impl::attention_shape(std::size_t max_len) const {
  return AttentionShape{static_cast<int>(d.num_heads), static_cast<int>(d.num_kv_heads), static_cast<int>(d.head_dim),
                        rotary_dim(), static_cast<float>(d.rms_norm_eps), inv_freq, static_cast<int>(max_len),
                        attn_scratch, attn_counters};
}

const __nv_bfloat16* CudaBackend::Impl::place(const std::vector<uint16_t>& host) {
  const std::size_t bytes = host.size() * 2, at = (arena_used + 255) / 256 * 256;
  if (at + bytes > arena_bytes) throw std::logic_error("cuda backend: resident arena overflow");
  CUDA_CHECK(cudaMemcpy(arena + at, host.data(), bytes, cudaMemcpyHostToDevice));
  arena_used = at + bytes;
  return reinterpret_cast<const bf16*>(arena + at);
}

std::size_t CudaBackend::Impl::resident_elems() const {
  std::size_t n = static_cast<std::size_t>(d.vocab_size) * hidden() * (d.tie_word_embeddings ? 1 : 2) + hidden();
  for (const auto& l : d.layers) {
    n += 2 * static_cast<std::size_t>(hidden()) + 2 * static_cast<std::size_t>(d.head_dim);
    n += static_cast<std::size_t>(hidden()) * (2 * q_dim() + 2 * kv_dim());
    if (l.mlp == MlpKind::moe) n += static_cast<std::size_t>(d.moe.num_experts) * hidden();
    else n += 3 * static_cast<std::size_t>(d.intermediate_size) * hidden();
  }
  return n + 256 * (16 * d.layers.size() + 8);  // alignment slack
}

void CudaBackend::Impl::allocate_activations() {
  const std::size_t H = static_cast<std::size_t>(hidden());
  const std::size_t topk = static_cast<std::size_t>(std::max<int64_t>(d.moe.top_k, 1));
  const std::size_t inter = static_cast<std::size_t>(std::max<int64_t>(d.moe.intermediate_size, 8));
  const std::size_t dense = static_cast<std::size_t>(std::max<int64_t>(d.intermediate_size, 8));
  auto f = [](float** p, std::size_t n) { CUDA_CHECK(cudaMalloc(p, n * sizeof(float))); };
  f(&x, H); f(&xn, H); f(&qkv, static_cast<std::size_t>(qkv_dim())); f(&attn, static_cast<std::size_t>(q_dim()));
  f(&router_logits, static_cast<std::size_t>(std::max<int64_t>(d.moe.num_experts, 1)));
  f(&route_w, topk); f(&act, topk * inter);
  f(&g, dense); f(&u, dense); f(&h, dense); f(&logits, static_cast<std::size_t>(d.vocab_size));
  CUDA_CHECK(cudaMalloc(&route_ids, topk * sizeof(int32_t)));
  // Token and position side by side: one host→device copy per decode step.
  CUDA_CHECK(cudaMalloc(&d_token, 2 * sizeof(int32_t)));
  d_pos = d_token + 1;
  CUDA_CHECK(cudaMalloc(&router_done, sizeof(unsigned int)));
  CUDA_CHECK(cudaMemset(router_done, 0, sizeof(unsigned int)));
  CUDA_CHECK(cudaMalloc(&counters, 2 * sizeof(unsigned long long)));
  CUDA_CHECK(cudaMemset(counters, 0, 2 * sizeof(unsigned long long)));
  const std::size_t lc = std::max<std::size_t>(1, d.layers.size() * static_cast<std::size_t>(std::max<int64_t>(d.moe.num_experts, 1)));
  CUDA_CHECK(cudaMalloc(&layer_counts, lc * sizeof(unsigned long long)));
  CUDA_CHECK(cudaMemset(layer_counts, 0, lc * sizeof(unsigned long long)));
  f(&attn_scratch, attention_scratch_floats(static_cast<int>(d.num_heads), static_cast<int>(d.head_dim)));
  CUDA_CHECK(cudaMalloc(&attn_counters, static_cast<std::size_t>(d.num_heads) * sizeof(unsigned int)));
  CUDA_CHECK(cudaMemset(attn_counters, 0, static_cast<std::size_t>(d.num_heads) * sizeof(unsigned int)));
  const std::vector<float> freq = rope_inv_freq(static_cast<float>(d.rope_theta), rotary_dim());
  CUDA_CHECK(cudaMalloc(&inv_freq, freq.size() * sizeof(float)));
  CUDA_CHECK(cudaMemcpy(inv_freq, freq.data(), freq.size() * sizeof(float), cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMallocHost(&h_scalars, 2 * sizeof(int32_t)));
  CUDA_CHECK(cudaMallocHost(&h_logits, static_cast<std::size_t>(d.vocab_size) * sizeof(float)));
}

// Six launches per MoE layer (fused.cuh): norm+qkv, attention (q/k-norm, RoPE, KV append),
// o-proj + residual, norm+router+top-k+counters, gate/up+SwiGLU, down+reduction+residual.
void CudaBackend::Impl::step(CudaKvCache& c) {
  const int H = hidden();
  const float eps = static_cast<float>(d.rms_norm_eps);
  const AttentionShape shape = attention_shape(c.capacity_);
  const bool pdl = opt.use_pdl;
  launch_embed(embed, d_token, x, H, stream);
  for (std::size_t li = 0; li < layers.size(); ++li) {
    const LayerDev& L = layers[li];
    const int l = static_cast<int>(li);
    launch_norm_gemv_bf16(L.qkv, x, L.input_norm, eps, qkv, qkv_dim(), H, false, nullptr, stream, pdl);
    launch_attention_decode_fused(qkv, L.q_norm, L.k_norm, c.k(l), c.v(l), attn, shape, d_pos, stream, pdl);
    launch_gemv_bf16_pdl(L.o, attn, x, H, q_dim(), true, stream, pdl);
    if (L.moe) {
      const int E = static_cast<int>(d.moe.num_experts), K = static_cast<int>(d.moe.top_k);
      const int si = moe_index[li];
      const RouterOutputs ro{router_logits, route_ids, route_w, router_done,
                             store->device_hot_flags() + static_cast<std::size_t>(si) * E, counters,
                             layer_counts + static_cast<std::size_t>(si) * E};
      launch_router_fused(L.router, x, L.post_norm, eps, xn, E, H, K, d.moe.norm_topk_prob, ro, stream, pdl);
      launch_moe_gate_up_fused(store->table(si), xn, route_ids, K, act, stream, pdl);
      launch_moe_down_fused(store->table(si), act, route_ids, route_w, K, x, stream, pdl);
    } else {
      const int I = static_cast<int>(d.intermediate_size);
      launch_norm_gemv_bf16(L.mlp_gate, x, L.post_norm, eps, g, I, H, false, nullptr, stream);
      launch_norm_gemv_bf16(L.mlp_up, x, L.post_norm, eps, u, I, H, false, nullptr, stream);
      launch_swiglu(g, u, h, I, stream);
      launch_gemv_bf16(L.mlp_down, h, x, H, I, true, stream);
    }
  }
  // Final norm + lm_head inside the step (and its graph): logits of the token just decoded.
  launch_norm_gemv_bf16(lm_head, x, final_norm, eps, logits, static_cast<int>(d.vocab_size), H, false, nullptr, stream, pdl);
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
      cudaMemcpy(counts.data(), m.layer_counts, counts.size() * sizeof(unsigned long long), cudaMemcpyDeviceToHost);
      offload::ExpertProfile p;
      p.layout = "layers=" + std::to_string(m.store->n_layers()) + " experts=" + std::to_string(E) + " offloaded=all";
      for (int l = 0; l < m.store->n_layers(); ++l)
        p.counts.emplace_back(counts.begin() + static_cast<std::ptrdiff_t>(l) * E, counts.begin() + static_cast<std::ptrdiff_t>(l + 1) * E);
      offload::save_expert_profile(p, m.opt.capture_profile_path);
    } catch (...) {
      // Destructors do not throw; the profile is simply not written.
    }
  }
  m.store.reset();
  for (void* p : {static_cast<void*>(m.arena), static_cast<void*>(m.x), static_cast<void*>(m.xn), static_cast<void*>(m.qkv),
                  static_cast<void*>(m.attn), static_cast<void*>(m.router_logits), static_cast<void*>(m.route_w),
                  static_cast<void*>(m.act), static_cast<void*>(m.router_done), static_cast<void*>(m.inv_freq), static_cast<void*>(m.attn_scratch), static_cast<void*>(m.attn_counters), static_cast<void*>(m.g), static_cast<void*>(m.u), static_cast<void*>(m.h),
                  static_cast<void*>(m.logits), static_cast<void*>(m.route_ids), static_cast<void*>(m.d_token),
                  static_cast<void*>(m.counters), static_cast<void*>(m.layer_counts)})
    if (p) cudaFree(p);
  if (m.h_scalars) cudaFreeHost(m.h_scalars);
  if (m.h_logits) cudaFreeHost(m.h_logits);
  for (int b = 0; b < 2; ++b) {
    if (m.stage_ready[b]) cudaEventDestroy(m.stage_ready[b]);
    if (m.stage_free[b]) cudaEventDestroy(m.stage_free[b]);
  }
  if (m.cublas) cublasDestroy(m.cublas);
  if (m.copy_stream) cudaStreamDestroy(m.copy_stream);
  if (m.stream) cudaStreamDestroy(m.stream);
}

std::size_t CudaBackend::vocab_size() const { return static_cast<std::size_t>(impl_->d.vocab_size); }
std::size_t CudaBackend::kv_bytes_per_token() const { return static_cast<std::size_t>(impl_->d.kv_bytes_per_token_f32()); }
const ModelDescription& CudaBackend::description() const { return impl_->d; }
const std::vector<std::string>& CudaBackend::warnings() const { return impl_->warnings; }
std::size_t CudaBackend::expert_block_bytes() const { return impl_->store ? impl_->store->block_bytes() : 0; }
std::size_t CudaBackend::resident_bytes() const { return impl_->arena_used; }
std::size_t CudaBackend::host_bytes_mapped() const { return impl_->store ? impl_->store->host_bytes_mapped() : 0; }
std::size_t CudaBackend::expert_bytes() const { return impl_->store ? impl_->store->expert_bytes() : 0; }
int CudaBackend::hot_slots() const { return impl_->store ? impl_->store->slots() : 0; }

double CudaBackend::decode_step_us(KvCache& cache_base, int reps) {
  Impl& m = *impl_;
  auto& c = dynamic_cast<CudaKvCache&>(cache_base);
  if (!c.graph_ || c.last_pos_ < 0 || reps <= 0)
    throw std::logic_error("decode_step_us: the cache has no decode graph yet (or reps <= 0)");
  // The graph reads the backend's token/position words, which the last step on ANY cache set:
  // point them back at this cache's last step (its KV row is rewritten with the same values).
  CUDA_CHECK(cudaStreamSynchronize(m.stream));
  m.h_scalars[0] = c.last_token_;
  m.h_scalars[1] = c.last_pos_;
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
      for (int i = 0; i < reps; ++i) CUDA_CHECK(cudaGraphLaunch(c.graph_, m.stream));
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

void CudaBackend::set_use_pdl(bool on) { impl_->opt.use_pdl = on; }
void CudaBackend::set_flash_attention(bool on, int min_keys) {
  CUDA_CHECK(cudaStreamSynchronize(impl_->stream));
  impl_->opt.flash_attention = on;
  impl_->opt.flash_attention_min_keys = min_keys;
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

std::unique_ptr<KvCache> CudaBackend::new_cache(std::size_t max_tokens) {
  return std::make_unique<CudaKvCache>(max_tokens, static_cast<int>(impl_->d.num_layers), impl_->kv_dim());
}

std::vector<float> CudaBackend::forward(KvCache& cache_base, std::span<const int32_t> tokens, bool all_logits) {
  Impl& m = *impl_;
  auto& c = dynamic_cast<CudaKvCache&>(cache_base);
  if (c.length_ + tokens.size() > c.capacity_) {
    throw KvCacheFull("KV cache full: " + std::to_string(c.length_) + " cached + " + std::to_string(tokens.size()) +
                      " new tokens exceed the capacity of " + std::to_string(c.capacity_) + " tokens");
  }
  const std::size_t V = static_cast<std::size_t>(m.d.vocab_size);
  for (const int32_t t : tokens)
    if (t < 0 || static_cast<std::size_t>(t) >= V)
      throw std::out_of_range("token id " + std::to_string(t) + " outside the vocabulary of " + std::to_string(V));
  std::vector<float> out;
  out.reserve(all_logits ? V * tokens.size() : V);
  if (tokens.size() > 1 && m.opt.staged_prefill) {
    m.prefill(c, tokens, all_logits, out);
    return out;
  }
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    m.h_scalars[0] = c.last_token_ = tokens[i];
    m.h_scalars[1] = c.last_pos_ = static_cast<int32_t>(c.length_);
    CUDA_CHECK(cudaMemcpyAsync(m.d_token, m.h_scalars, 2 * sizeof(int32_t), cudaMemcpyHostToDevice, m.stream));
    if (m.opt.use_graphs) {
      if (!c.graph_) {
        cudaGraph_t graph;
        CUDA_CHECK(cudaStreamBeginCapture(m.stream, cudaStreamCaptureModeThreadLocal));
        m.step(c);
        CUDA_CHECK(cudaStreamEndCapture(m.stream, &graph));
        CUDA_CHECK(cudaGraphInstantiate(&c.graph_, graph, 0));
        CUDA_CHECK(cudaGraphDestroy(graph));
      }
      CUDA_CHECK(cudaGraphLaunch(c.graph_, m.stream));
    } else {
      m.step(c);
    }
    ++c.length_;
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
  return out;
}

namespace {

using Source = std::function<void(const std::string& what, uint16_t* dst, std::size_t count, float fan_in)>;

std::unique_ptr<CudaBackend::Impl> build(const ModelDescription& d, CudaBackendOptions opt, const Source& src,
                                         const std::function<void(int layer, int expert, uint16_t* block)>& expert_src) {
  auto m = std::make_unique<CudaBackend::Impl>();
  m->d = d;
  m->opt = opt;
  CUDA_CHECK(cudaSetDevice(opt.device));
  CUDA_CHECK(cudaStreamCreateWithFlags(&m->stream, cudaStreamNonBlocking));
  CUDA_CHECK(cudaStreamCreateWithFlags(&m->copy_stream, cudaStreamNonBlocking));
  for (int b = 0; b < 2; ++b) {
    CUDA_CHECK(cudaEventCreateWithFlags(&m->stage_ready[b], cudaEventDisableTiming));
    CUDA_CHECK(cudaEventCreateWithFlags(&m->stage_free[b], cudaEventDisableTiming));
  }
  if (cublasCreate(&m->cublas) != CUBLAS_STATUS_SUCCESS) throw std::runtime_error("cuda backend: cublasCreate failed");
  if (cublasSetStream(m->cublas, m->stream) != CUBLAS_STATUS_SUCCESS) throw std::runtime_error("cuda backend: cublasSetStream failed");
  m->stage_group = static_cast<std::size_t>(std::max(1, opt.stage_group));
  m->arena_bytes = m->resident_elems() * 2;
  CUDA_CHECK(cudaMalloc(&m->arena, m->arena_bytes));
  const std::size_t H = static_cast<std::size_t>(d.hidden_size);
  auto upload = [&](const std::string& what, std::size_t count, float fan_in) {
    std::vector<uint16_t> host(count);
    src(what, host.data(), count, fan_in);
    return m->place(host);
  };
  m->embed = upload("embed", static_cast<std::size_t>(d.vocab_size) * H, 1.f);
  m->lm_head = d.tie_word_embeddings ? m->embed : upload("lm_head", static_cast<std::size_t>(d.vocab_size) * H, static_cast<float>(H));
  m->final_norm = upload("final_norm", H, 0.f);
  int moe_layers = 0;
  for (std::size_t l = 0; l < d.layers.size(); ++l) {
    const std::string p = "layer " + std::to_string(l) + " ";
    LayerDev L{};
    L.input_norm = upload(p + "input_norm", H, 0.f);
    {  // q | k | v concatenated: one GEMV (decode) or GEMM (prefill) computes all three
      const std::size_t nq = static_cast<std::size_t>(m->q_dim()) * H, nkv = static_cast<std::size_t>(m->kv_dim()) * H;
      std::vector<uint16_t> host(nq + 2 * nkv);
      src(p + "q", host.data(), nq, static_cast<float>(H));
      src(p + "k", host.data() + nq, nkv, static_cast<float>(H));
      src(p + "v", host.data() + nq + nkv, nkv, static_cast<float>(H));
      L.qkv = m->place(host);
    }
    L.o = upload(p + "o", H * static_cast<std::size_t>(m->q_dim()), static_cast<float>(m->q_dim()));
    L.q_norm = d.qk_norm ? upload(p + "q_norm", static_cast<std::size_t>(d.head_dim), 0.f) : nullptr;
    L.k_norm = d.qk_norm ? upload(p + "k_norm", static_cast<std::size_t>(d.head_dim), 0.f) : nullptr;
    L.post_norm = upload(p + "post_norm", H, 0.f);
    L.moe = d.layers[l].mlp == MlpKind::moe;
    if (L.moe) {
      L.router = upload(p + "router", static_cast<std::size_t>(d.moe.num_experts) * H, static_cast<float>(H));
      m->moe_index.push_back(moe_layers++);
    } else {
      const std::size_t I = static_cast<std::size_t>(d.intermediate_size);
      L.mlp_gate = upload(p + "mlp_gate", I * H, static_cast<float>(H));
      L.mlp_up = upload(p + "mlp_up", I * H, static_cast<float>(H));
      L.mlp_down = upload(p + "mlp_down", H * I, static_cast<float>(I));
      m->moe_index.push_back(-1);
    }
    m->layers.push_back(L);
  }
  if (moe_layers > 0) {
    const int E = static_cast<int>(d.moe.num_experts);
    m->store = std::make_unique<offload::ExpertStore>(moe_layers, E, static_cast<int>(H), static_cast<int>(d.moe.intermediate_size));
    // Fill host blocks in parallel (the 30B benchmark shape holds ~58 GB of experts).
    const int threads = std::max(1u, std::min(16u, std::thread::hardware_concurrency()));
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t) {
      pool.emplace_back([&, t] {
        for (int idx = t; idx < moe_layers * E; idx += threads)
          expert_src(idx / E, idx % E, reinterpret_cast<uint16_t*>(m->store->host_block(idx / E, idx % E)));
      });
    }
    for (auto& th : pool) th.join();
    m->store->register_host();
    if (!opt.profile_path.empty()) {
      m->profile = offload::load_expert_profile(opt.profile_path);
      m->have_profile = true;
      const std::string layout = "layers=" + std::to_string(moe_layers) + " experts=" + std::to_string(E) + " offloaded=all";
      if (m->profile.layout != layout)
        m->warnings.push_back("hot-expert profile " + opt.profile_path + " was captured at layout '" + m->profile.layout +
                              "', this launch is '" + layout + "'; mismatched layers fall back to id order");
    }
    int slots = opt.hot_slots >= 0 ? opt.hot_slots : static_cast<int>(std::lround(opt.hot_fraction * E));
    if (opt.vram_budget_gib > 0) {
      const double budget = opt.vram_budget_gib * 1073741824.0 - static_cast<double>(m->arena_used) - 2.0 * 1073741824.0;
      const int fit = budget <= 0 ? 0 : static_cast<int>(budget / (static_cast<double>(m->store->block_bytes()) * moe_layers));
      if (fit < slots) {
        m->warnings.push_back("--vram-budget-gib " + std::to_string(opt.vram_budget_gib) + " leaves room for " +
                              std::to_string(fit) + " hot experts per layer (asked " + std::to_string(slots) + ")");
        slots = fit;
      }
    }
    m->store->fill_hot_cache(slots, m->have_profile ? &m->profile : nullptr, &m->warnings);
  }
  m->allocate_activations();
  return m;
}

}  // namespace

std::unique_ptr<CudaBackend> make_cuda_backend(const Checkpoint& ck, CudaBackendOptions opt) {
  const ModelDescription& d = ck.description();
  auto tensor_for = [&](const std::string& what) -> const TensorRef& {
    if (what == "embed") return ck.embed_tokens();
    if (what == "lm_head") return ck.lm_head();
    if (what == "final_norm") return ck.final_norm();
    const std::size_t space = what.find(' ', 6);
    const std::size_t l = std::stoul(what.substr(6, space - 6));
    const std::string f = what.substr(space + 1);
    const LayerWeights& L = ck.layers()[l];
    if (f == "input_norm") return L.input_norm;
    if (f == "q") return L.q_proj;
    if (f == "k") return L.k_proj;
    if (f == "v") return L.v_proj;
    if (f == "o") return L.o_proj;
    if (f == "q_norm") return L.q_norm;
    if (f == "k_norm") return L.k_norm;
    if (f == "post_norm") return L.post_attn_norm;
    if (f == "router") return L.router;
    if (f == "mlp_gate") return L.mlp_gate;
    if (f == "mlp_up") return L.mlp_up;
    if (f == "mlp_down") return L.mlp_down;
    throw std::logic_error("cuda backend: no tensor for " + what);
  };
  Source src = [&](const std::string& what, uint16_t* dst, std::size_t count, float) { to_bf16(tensor_for(what), dst, count); };
  std::vector<int> moe_layers;
  for (std::size_t l = 0; l < d.layers.size(); ++l)
    if (d.layers[l].mlp == MlpKind::moe) moe_layers.push_back(static_cast<int>(l));
  auto experts = [&](int si, int e, uint16_t* block) {
    const ExpertWeights& w = ck.layers()[static_cast<std::size_t>(moe_layers[static_cast<std::size_t>(si)])].experts[static_cast<std::size_t>(e)];
    const std::size_t n = static_cast<std::size_t>(d.moe.intermediate_size) * static_cast<std::size_t>(d.hidden_size);
    to_bf16(w.gate, block, n);
    to_bf16(w.up, block + n, n);
    to_bf16(w.down, block + 2 * n, n);
  };
  return std::unique_ptr<CudaBackend>(new CudaBackend(build(d, opt, src, experts)));
}

std::unique_ptr<CudaBackend> make_synthetic_cuda_backend(const ModelDescription& d, uint64_t seed, CudaBackendOptions opt) {
  std::map<std::string, uint64_t> ids;
  Source src = [&](const std::string& what, uint16_t* dst, std::size_t count, float fan_in) {
    if (fan_in == 0.f) {  // norms: ones
      for (std::size_t i = 0; i < count; ++i) dst[i] = f32_to_bf16_bits(1.f);
      return;
    }
    const uint64_t id = ids.emplace(what, ids.size() + 1).first->second;
    fill_random(dst, count, seed ^ (id * 0x100000001B3ull), fan_in == 1.f ? 0.5f : 1.f / std::sqrt(fan_in));
  };
  const std::size_t H = static_cast<std::size_t>(d.hidden_size), I = static_cast<std::size_t>(d.moe.intermediate_size);
  auto experts = [&](int layer, int e, uint16_t* block) {
    const uint64_t s = seed + 0x51ED270B27ull * (static_cast<uint64_t>(layer) * 4096 + static_cast<uint64_t>(e) + 1);
    fill_random(block, 2 * I * H, s, 1.f / std::sqrt(static_cast<float>(H)));
    fill_random(block + 2 * I * H, H * I, s + 7, 1.f / std::sqrt(static_cast<float>(I)));
  };
  return std::unique_ptr<CudaBackend>(new CudaBackend(build(d, opt, src, experts)));
}

std::unique_ptr<Backend> make_cuda_backend_from_dir(const std::string& dir, CudaBackendOptions opt) {
  auto ck = std::make_unique<Checkpoint>(Checkpoint::open(dir));
  std::unique_ptr<CudaBackend> b = make_cuda_backend(*ck, opt);
  b->impl_->owned_checkpoint = std::move(ck);
  return b;
}

bool cuda_device_available() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

}  // namespace servedeck::worker::cuda
