// Loading the CUDA backend: a checkpoint's tensors converted to bf16 and uploaded (resident
// weights into one VRAM arena, routed experts into the ExpertStore), or weights synthesised from a
// seed for the benchmark shapes; then the activations, the hot-expert cache and cuBLAS.
#include "worker/cuda/cuda_backend.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>

#include "worker/cuda/backend_impl.cuh"
#include "worker/cuda/cuda_check.hpp"
#include "worker/cuda/fused.cuh"
#include "worker/cuda/kernels.cuh"
#include "worker/cuda/load_weights.cuh"
#include "worker/cuda/quant_layout.cuh"
#include "worker/model/quantize.hpp"
#include "worker/offload/expert_store.hpp"

namespace servedeck::worker::cuda {

using detail::LayerDev;
using detail::f32_to_bf16_bits;
using detail::fill_random;
using detail::fold_yarn_scale;
using detail::quantise_into;
using detail::to_bf16;
using detail::to_f32;
using detail::write_quantised;


namespace {

using Source = std::function<void(const std::string& what, uint16_t* dst, std::size_t count, float fan_in)>;
/// fp32 values of a small tensor (biases: "layer L q_bias" / k_bias / v_bias / router_bias).
using Source32 = std::function<void(const std::string& what, float* dst, std::size_t count)>;

// Every MoE layer's router folded through its post-attention norm and o-proj (fold_router_weights),
// for the decode step's launch_router_folded, when the shapes allow it (the preconditions of
// launch_router_folded and launch_moe_gate_up_normed, which ranks the logits in x's shared
// memory: n_experts <= hidden); otherwise the step runs the unfolded router:
// 4 · n_experts · (hidden + q_dim) bytes per MoE layer (3 MiB at the benchmark shape).
void fold_routers(CudaBackend::Impl& m) {
  const ModelDescription& d = m.d;
  const int E = static_cast<int>(d.moe.num_experts), K = static_cast<int>(d.moe.top_k), H = m.hidden(), Q = m.q_dim();
  // The fold ranks softmax probabilities, which the factor 1/rms does not reorder; the sigmoid
  // router's choice (sigmoid + bias) it would.
  if (d.moe.router != RouterKind::softmax_topk) return;
  std::size_t n_moe = 0;
  for (const auto& L : m.layers) n_moe += L.moe ? 1 : 0;
  if (n_moe == 0 || E < K || E > 1024 || E > H || K < 1 || K > 32 || H % 8 != 0 || H > 2048 || Q % 4 != 0) return;
  const std::size_t row = static_cast<std::size_t>(H) + static_cast<std::size_t>(Q), per = static_cast<std::size_t>(E) * row;
  m.router_folded_bytes = n_moe * per * sizeof(float);
  m.router_folded = static_cast<float*>(m.device_alloc(m.router_folded_bytes));
  // place() copies from pageable memory with cudaMemcpy, which may return before the copy has
  // landed; m.stream does not wait for the legacy stream. The folds read those weights.
  CUDA_CHECK(cudaDeviceSynchronize());
  std::size_t i = 0;
  for (auto& L : m.layers) {
    if (!L.moe) continue;
    float* dst = m.router_folded + i++ * per;
    fold_router_weights(L.router, L.post_norm, L.o, dst, E, H, Q, m.stream);
    L.router_folded = dst;
  }
  CUDA_CHECK(cudaStreamSynchronize(m.stream));
}

std::unique_ptr<CudaBackend::Impl> build(const ModelDescription& d, CudaBackendOptions opt, const Source& src, const Source32& src32,
                                         const std::function<void(int layer, int expert, std::byte* block)>& expert_src,
                                         const QuantLayout& layout) {
  if (const std::string why = cuda_backend_unsupported(d); !why.empty()) throw ConfigError(why);
  if (opt.stage_buffers < 0 || opt.stage_buffers == 1 || opt.stage_group < 1)
    throw std::invalid_argument("cuda backend: stage_buffers must be 0 (auto) or >= 2 and stage_group >= 1, got " +
                                std::to_string(opt.stage_buffers) + " and " + std::to_string(opt.stage_group));
  if (opt.stage_buffers == 0) {  // auto: one MoE layer's experts can be in flight
    const int64_t experts = std::max<int64_t>(d.moe.num_experts, 0);
    opt.stage_buffers = static_cast<int>(std::max<int64_t>(2, (experts + opt.stage_group - 1) / opt.stage_group));
  }
  if (opt.prefill_split_min_tokens < 0)
    throw std::invalid_argument("cuda backend: prefill_split_min_tokens must be >= 0 (0: never split), got " +
                                std::to_string(opt.prefill_split_min_tokens));
  auto m = std::make_unique<CudaBackend::Impl>();
  m->d = d;
  m->opt = opt;
  CUDA_CHECK(cudaSetDevice(opt.device));
  CUDA_CHECK(cudaStreamCreateWithFlags(&m->stream, cudaStreamNonBlocking));
  CUDA_CHECK(cudaStreamCreateWithFlags(&m->copy_stream, cudaStreamNonBlocking));
  m->stage_ready.assign(static_cast<std::size_t>(opt.stage_buffers), nullptr);
  m->stage_free.assign(static_cast<std::size_t>(opt.stage_buffers), nullptr);
  for (std::size_t b = 0; b < m->stage_ready.size(); ++b) {
    CUDA_CHECK(cudaEventCreateWithFlags(&m->stage_ready[b], cudaEventDisableTiming));
    CUDA_CHECK(cudaEventCreateWithFlags(&m->stage_free[b], cudaEventDisableTiming));
  }
  for (cudaEvent_t& e : m->ids_ready) CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  if (cublasCreate(&m->cublas) != CUBLAS_STATUS_SUCCESS) throw std::runtime_error("cuda backend: cublasCreate failed");
  if (cublasSetStream(m->cublas, m->stream) != CUBLAS_STATUS_SUCCESS) throw std::runtime_error("cuda backend: cublasSetStream failed");
  m->stage_group = static_cast<std::size_t>(std::max(1, opt.stage_group));
  m->arena_bytes = m->resident_elems() * 2;
  m->arena = static_cast<char*>(m->device_alloc(m->arena_bytes));
  const std::size_t H = static_cast<std::size_t>(d.hidden_size);
  auto upload = [&](const std::string& what, std::size_t count, float fan_in) {
    std::vector<uint16_t> host(count);
    src(what, host.data(), count, fan_in);
    return m->place(host);
  };
  m->embed = upload("embed", static_cast<std::size_t>(d.vocab_size) * H, 1.f);
  m->lm_head = d.tie_word_embeddings ? m->embed : upload("lm_head", static_cast<std::size_t>(d.vocab_size) * H, static_cast<float>(H));
  m->final_norm = upload("final_norm", H, 0.f);
  const float yarn_m = d.rope_scaling.kind == RopeScalingKind::yarn ? static_cast<float>(d.rope_scaling.attention_factor) : 1.f;
  int moe_layers = 0;
  for (std::size_t l = 0; l < d.layers.size(); ++l) {
    const std::string p = "layer " + std::to_string(l) + " ";
    LayerDev L{};
    L.input_norm = upload(p + "input_norm", H, 0.f);
    {  // q | k | v concatenated: one GEMV (decode) or GEMM (prefill) computes all three
      const std::size_t Q = static_cast<std::size_t>(m->q_dim()), KV = static_cast<std::size_t>(m->kv_dim());
      const std::size_t nq = Q * H, nkv = KV * H, hd = static_cast<std::size_t>(d.head_dim);
      std::vector<uint16_t> host(nq + 2 * nkv);
      src(p + "q", host.data(), nq, static_cast<float>(H));
      src(p + "k", host.data() + nq, nkv, static_cast<float>(H));
      src(p + "v", host.data() + nq + nkv, nkv, static_cast<float>(H));
      std::vector<float> bias;
      if (d.attention_bias) {
        bias.resize(Q + 2 * KV);
        src32(p + "q_bias", bias.data(), Q);
        src32(p + "k_bias", bias.data() + Q, KV);
        src32(p + "v_bias", bias.data() + Q + KV, KV);
      }
      std::vector<uint16_t> qn, kn;
      if (d.qk_norm) {
        qn.resize(hd);
        kn.resize(hd);
        src(p + "q_norm", qn.data(), hd, 0.f);
        src(p + "k_norm", kn.data(), hd, 0.f);
      }
      if (yarn_m != 1.f)
        fold_yarn_scale(yarn_m, static_cast<int>(hd), m->rotary_dim(), m->q_dim(), m->kv_dim(), H, host.data(),
                        d.attention_bias ? &bias : nullptr, d.qk_norm ? qn.data() : nullptr, d.qk_norm ? kn.data() : nullptr);
      L.qkv = m->place(host);
      if (d.attention_bias) L.qkv_bias = m->place_f32(bias);
      L.q_norm = d.qk_norm ? m->place(qn) : nullptr;
      L.k_norm = d.qk_norm ? m->place(kn) : nullptr;
    }
    L.o = upload(p + "o", H * static_cast<std::size_t>(m->q_dim()), static_cast<float>(m->q_dim()));
    L.post_norm = upload(p + "post_norm", H, 0.f);
    L.moe = d.layers[l].mlp == MlpKind::moe;
    if (L.moe) {
      const std::size_t E = static_cast<std::size_t>(d.moe.num_experts);
      L.router = upload(p + "router", E * H, static_cast<float>(H));
      if (d.moe.router == RouterKind::sigmoid_bias_topk) {
        std::vector<float> rb(E);
        src32(p + "router_bias", rb.data(), E);
        L.router_bias = m->place_f32(rb);
      }
      if (const std::size_t I = static_cast<std::size_t>(m->shared_inter()); I > 0) {
        std::vector<uint16_t> gu(2 * I * H);
        src(p + "shared_gate", gu.data(), I * H, static_cast<float>(H));
        src(p + "shared_up", gu.data() + I * H, I * H, static_cast<float>(H));
        L.shared_gate_up = m->place(gu);
        L.shared_down = upload(p + "shared_down", H * I, static_cast<float>(I));
      }
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
  fold_routers(*m);
  if (moe_layers > 0) {
    const int E = static_cast<int>(d.moe.num_experts);
    // The profile first: a file that is not one stops the load before minutes of expert copies,
    // unless this run also captures to it (then it is replaced at exit: a warning).
    if (!opt.profile_path.empty()) {
      const std::string want = offload::expert_profile_layout(moe_layers, E);
      std::optional<offload::ExpertProfile> p;
      bool unreadable = false;
      try {
        p = offload::read_expert_profile(opt.profile_path);
      } catch (const std::runtime_error& e) {
        if (opt.capture_profile_path != opt.profile_path) throw;
        unreadable = true;
        m->warnings.push_back(std::string(e.what()) + "; the hot cache holds each layer's lowest expert ids and this run's routing replaces the file at exit");
      }
      if (p) {
        m->profile = std::move(*p);
        m->have_profile = true;
        if (m->profile.layout != want)
          m->warnings.push_back("hot-expert profile " + opt.profile_path + " was captured at layout '" + m->profile.layout +
                                "', this launch is '" + want + "'; mismatched layers fall back to id order" +
                                (opt.capture_profile_path == opt.profile_path ? ", and this run's routing replaces the file at exit" : ""));
      } else if (!unreadable) {
        m->warnings.push_back("hot-expert profile " + opt.profile_path + " does not exist: the hot cache holds each layer's lowest expert ids" +
                              (opt.capture_profile_path == opt.profile_path ? std::string("; this run's routing is written there at exit")
                                                                            : std::string("; --capture-profile writes one")));
      }
    }
    m->store = std::make_unique<offload::ExpertStore>(moe_layers, E, layout);
    // Fill host blocks in parallel (the 30B benchmark shape holds ~58 GB of experts).
    const int threads = std::max(1u, std::min(16u, std::thread::hardware_concurrency()));
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t) {
      pool.emplace_back([&, t] {
        for (int idx = t; idx < moe_layers * E; idx += threads)
          expert_src(idx / E, idx % E, m->store->host_block(idx / E, idx % E));
      });
    }
    for (auto& th : pool) th.join();
    m->store->register_host();
    int slots = opt.hot_slots >= 0 ? opt.hot_slots : static_cast<int>(std::lround(opt.hot_fraction * E));
    if (opt.vram_budget_gib > 0) {
      // The prefill staging ring (stage_buffers × stage_group experts), the KV pool and the
      // prefill's contiguous bf16 copy of one layer's rows of it come out of the budget too.
      const double staging = static_cast<double>(opt.stage_buffers) * opt.stage_group * static_cast<double>(m->store->block_bytes());
      const double kv = static_cast<double>(opt.kv_cache_bytes) * (1.0 + 1.0 / static_cast<double>(std::max<int64_t>(d.num_layers, 1)));
      const double budget = opt.vram_budget_gib * 1073741824.0 - static_cast<double>(m->arena_used) -
                            static_cast<double>(m->router_folded_bytes) - staging - kv - 2.0 * 1073741824.0;
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

/// The expert store's layout for `ck`: the checkpoint's own format when every routed expert is
/// stored in it with one block size (and the shapes suit the kernels: hidden and inter multiples
/// of 32, FP8 block columns a multiple of 16); bf16 otherwise (quantised experts then
/// dequantised at load, with a warning naming why).
QuantLayout expert_layout(const Checkpoint& ck, std::vector<std::string>& warnings) {
  const ModelDescription& d = ck.description();
  QuantLayout L{ExpertFormat::bf16, static_cast<int>(d.hidden_size), static_cast<int>(d.moe.intermediate_size), 128, 128};
  const WeightFormat f = ck.quantization().format;
  if (f == WeightFormat::plain) return L;
  bool uniform = true, any = false;
  for (const auto& layer : ck.layers())
    for (const auto& e : layer.experts)
      for (const WeightRef* w : {&e.gate, &e.up, &e.down}) {
        any = true;
        uniform = uniform && w->quant && w->quant->format == f &&
                  (f != WeightFormat::fp8_block ||
                   (w->quant->block_rows == ck.quantization().block_rows && w->quant->block_cols == ck.quantization().block_cols));
      }
  // The quantised down reads 8 rows under one FP8 block row (quant_moe.cu: block rows a multiple of 8).
  const bool shapes = L.hidden % 32 == 0 && L.inter % 32 == 0 &&
                      (f != WeightFormat::fp8_block || (ck.quantization().block_cols % 16 == 0 && ck.quantization().block_rows % 8 == 0));
  if (!any) return L;
  if (!uniform || !shapes) {
    warnings.push_back(std::string("routed experts dequantised to bf16 at load: ") +
                       (!uniform ? "not every expert is stored " + std::string(to_string(f)) + " with one block size"
                                 : "hidden and moe_intermediate must be multiples of 32 (fp8: block columns of 16, block rows of 8) to stay quantised"));
    return L;
  }
  L.format = f == WeightFormat::fp8_block ? ExpertFormat::fp8_block : ExpertFormat::nvfp4;
  L.br = static_cast<int>(ck.quantization().block_rows);
  L.bc = static_cast<int>(ck.quantization().block_cols);
  return L;
}

std::unique_ptr<CudaBackend> make_cuda_backend(const Checkpoint& ck, CudaBackendOptions opt) {
  const ModelDescription& d = ck.description();
  auto plain = [](const TensorRef& t) {
    WeightRef w;
    static_cast<TensorRef&>(w) = t;
    return w;
  };
  auto tensor_for = [&](const std::string& what) -> WeightRef {
    if (what == "embed") return plain(ck.embed_tokens());
    if (what == "lm_head") return ck.lm_head();
    if (what == "final_norm") return plain(ck.final_norm());
    const std::size_t space = what.find(' ', 6);
    const std::size_t l = std::stoul(what.substr(6, space - 6));
    const std::string f = what.substr(space + 1);
    const LayerWeights& L = ck.layers()[l];
    if (f == "input_norm") return plain(L.input_norm);
    if (f == "q") return L.q_proj;
    if (f == "k") return L.k_proj;
    if (f == "v") return L.v_proj;
    if (f == "o") return L.o_proj;
    if (f == "q_norm") return plain(L.q_norm);
    if (f == "k_norm") return plain(L.k_norm);
    if (f == "post_norm") return plain(L.post_attn_norm);
    if (f == "router") return L.router;
    if (f == "mlp_gate") return L.mlp_gate;
    if (f == "mlp_up") return L.mlp_up;
    if (f == "mlp_down") return L.mlp_down;
    if (f == "shared_gate") return L.shared.gate;
    if (f == "shared_up") return L.shared.up;
    if (f == "shared_down") return L.shared.down;
    if (f == "q_bias") return plain(L.q_bias);
    if (f == "k_bias") return plain(L.k_bias);
    if (f == "v_bias") return plain(L.v_bias);
    if (f == "router_bias") return plain(L.router_bias);
    throw std::logic_error("cuda backend: no tensor for " + what);
  };
  Source src = [&](const std::string& what, uint16_t* dst, std::size_t count, float) { to_bf16(tensor_for(what), dst, count); };
  Source32 src32 = [&](const std::string& what, float* dst, std::size_t count) { to_f32(tensor_for(what), dst, count); };
  std::vector<int> moe_layers;
  for (std::size_t l = 0; l < d.layers.size(); ++l)
    if (d.layers[l].mlp == MlpKind::moe) moe_layers.push_back(static_cast<int>(l));
  std::vector<std::string> warnings;
  const QuantLayout layout = expert_layout(ck, warnings);
  auto experts = [&](int si, int e, std::byte* block) {
    const ExpertWeights& w = ck.layers()[static_cast<std::size_t>(moe_layers[static_cast<std::size_t>(si)])].experts[static_cast<std::size_t>(e)];
    if (layout.format != ExpertFormat::bf16) {
      write_quantised(layout, 0, *w.gate.quant, block);
      write_quantised(layout, 1, *w.up.quant, block);
      write_quantised(layout, 2, *w.down.quant, block);
      return;
    }
    const std::size_t n = static_cast<std::size_t>(d.moe.intermediate_size) * static_cast<std::size_t>(d.hidden_size);
    auto* b16 = reinterpret_cast<uint16_t*>(block);
    to_bf16(w.gate, b16, n);
    to_bf16(w.up, b16 + n, n);
    to_bf16(w.down, b16 + 2 * n, n);
  };
  auto impl = build(d, opt, src, src32, experts, layout);
  impl->warnings.insert(impl->warnings.begin(), warnings.begin(), warnings.end());
  return std::unique_ptr<CudaBackend>(new CudaBackend(std::move(impl)));
}

std::unique_ptr<CudaBackend> make_synthetic_cuda_backend(const ModelDescription& d, uint64_t seed, CudaBackendOptions opt,
                                                         ExpertFormat format) {
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
  const QuantLayout layout{format, static_cast<int>(H), static_cast<int>(I), 128, 128};
  auto experts = [&](int layer, int e, std::byte* block) {
    const uint64_t s = seed + 0x51ED270B27ull * (static_cast<uint64_t>(layer) * 4096 + static_cast<uint64_t>(e) + 1);
    if (format == ExpertFormat::bf16) {
      auto* b16 = reinterpret_cast<uint16_t*>(block);
      fill_random(b16, 2 * I * H, s, 1.f / std::sqrt(static_cast<float>(H)));
      fill_random(b16 + 2 * I * H, H * I, s + 7, 1.f / std::sqrt(static_cast<float>(I)));
      return;
    }
    // The same bf16 values, quantised in memory (the published quantisers' arithmetic).
    std::vector<uint16_t> b16(3 * I * H);
    fill_random(b16.data(), 2 * I * H, s, 1.f / std::sqrt(static_cast<float>(H)));
    fill_random(b16.data() + 2 * I * H, H * I, s + 7, 1.f / std::sqrt(static_cast<float>(I)));
    std::vector<float> f(b16.size());
    for (std::size_t i = 0; i < f.size(); ++i) {
      const uint32_t u = static_cast<uint32_t>(b16[i]) << 16;
      std::memcpy(&f[i], &u, 4);
    }
    quantise_into(layout, 0, f.data(), static_cast<int>(I), static_cast<int>(H), block);
    quantise_into(layout, 1, f.data() + I * H, static_cast<int>(I), static_cast<int>(H), block);
    quantise_into(layout, 2, f.data() + 2 * I * H, static_cast<int>(H), static_cast<int>(I), block);
  };
  // Biases (q|k|v, the router's correction bias) of a synthetic model are zero.
  Source32 src32 = [](const std::string&, float* dst, std::size_t count) { std::fill(dst, dst + count, 0.f); };
  return std::unique_ptr<CudaBackend>(new CudaBackend(build(d, opt, src, src32, experts, layout)));
}

std::unique_ptr<Backend> make_cuda_backend_from_dir(const std::string& dir, CudaBackendOptions opt) {
  auto ck = std::make_unique<Checkpoint>(Checkpoint::open(dir));
  std::unique_ptr<CudaBackend> b = make_cuda_backend(*ck, opt);
  b->impl_->owned_checkpoint = std::move(ck);
  return b;
}

}  // namespace servedeck::worker::cuda
