#include "worker/cpu/cpu_backend.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "worker/cpu/dequantized_weights.hpp"
#include "worker/cpu/ops.hpp"

namespace servedeck::worker {

namespace {

using cpu::matmul;
using cpu::parallel_for;
using cpu::to_f32;
using cpu::DequantizedWeights;

std::vector<float> widen(const TensorRef& t) {
  std::vector<float> out(t.info->element_count());
  to_f32(t, 0, out.size(), out.data());
  return out;
}

class CpuBackend final : public Backend {
 public:
  CpuBackend(const Checkpoint& ckpt, CpuBackendOptions options, std::shared_ptr<const Checkpoint> owned)
      : owned_(std::move(owned)), ck_(ckpt), d_(ckpt.description()),
        threads_(options.threads ? options.threads : std::max(1u, std::thread::hardware_concurrency())),
        weights_(ckpt, threads_) {
    kv_dtype_ = options.kv_dtype;
    inv_freq_ = d_.rope_inv_freq();
    rope_scale_ = static_cast<float>(d_.rope_scaling.attention_factor);
    // Norm weights, biases and the router's correction bias are tiny: widen once.
    final_norm_ = widen(ck_.final_norm());
    for (std::size_t l = 0; l < ck_.layers().size(); ++l) {
      const auto& L = ck_.layers()[l];
      NormWeights n;
      n.input = widen(L.input_norm);
      n.post = widen(L.post_attn_norm);
      if (d_.qk_norm) {
        n.q = widen(L.q_norm);
        n.k = widen(L.k_norm);
      }
      if (d_.attention_bias) {
        n.q_bias = widen(L.q_bias);
        n.k_bias = widen(L.k_bias);
        n.v_bias = widen(L.v_bias);
      }
      if (d_.layers[l].mlp == MlpKind::moe && d_.moe.router == RouterKind::sigmoid_bias_topk)
        n.router_bias = widen(L.router_bias);
      norms_.push_back(std::move(n));
    }
  }

  std::size_t vocab_size() const override { return static_cast<std::size_t>(d_.vocab_size); }
  std::size_t kv_bytes_per_token() const override {
    return static_cast<std::size_t>(d_.num_layers) * 2 * kv_dim() * kv_dtype_bytes(kv_dtype_);
  }
  std::string name() const override { return "cpu"; }

  void allocate_kv_pool(const KvPoolShape& shape) override;
  std::size_t kv_pool_allocations() const override { return pool_allocations_; }
  std::vector<float> forward(const KvView& kv, std::span<const int32_t> tokens, bool all_logits) override;

 private:
  struct NormWeights {
    std::vector<float> input, post, q, k;      // (hidden), (hidden), (head_dim), (head_dim)
    std::vector<float> q_bias, k_bias, v_bias;  // (heads*head_dim), (kv_heads*head_dim) x2; attention_bias only
    std::vector<float> router_bias;             // (num_experts) e_score_correction_bias; sigmoid router only
  };

  std::size_t kv_dim() const { return static_cast<std::size_t>(d_.num_kv_heads * d_.head_dim); }
  /// Element offset of row `row` of K (kv 0) or V (kv 1) of `layer` in pool block `block`.
  std::size_t kv_offset(int32_t block, std::size_t layer, std::size_t kv, std::size_t row) const {
    const std::size_t layers = static_cast<std::size_t>(d_.num_layers);
    return ((static_cast<std::size_t>(block) * layers + layer) * 2 + kv) * pool_.block_tokens * kv_dim() + row * kv_dim();
  }
  /// Stores fp32 `src` (kv_dim) as position `pos`'s K (kv 0) or V (kv 1) row of `layer`.
  void store_row(const KvView& kv, std::size_t layer, std::size_t which, std::size_t pos, const float* src);
  /// Reads the K and V rows of positions [0, len) of `layer` through kv.blocks into k_ctx_ and
  /// v_ctx_, fp32, (len, kv_dim) each.
  void gather(const KvView& kv, std::size_t layer, std::size_t len);
  void attention(std::size_t layer, const KvView& kv, std::size_t n, std::vector<float>& xn, std::vector<float>& out);
  void moe(std::size_t layer, const std::vector<float>& xn, std::size_t n, std::vector<float>& out);
  /// Routes token `t` (router logits `lr`, num_experts): appends (token, weight) to by_expert.
  void route_softmax(float* lr, std::size_t t, std::vector<std::vector<std::pair<std::size_t, float>>>& by_expert) const;
  void route_sigmoid(std::size_t layer, const float* lr, std::size_t t,
                     std::vector<std::vector<std::pair<std::size_t, float>>>& by_expert) const;
  /// out = down(silu(gate(xn)) * up(xn)) for the n rows of xn (the weights' own widths).
  void swiglu(const ExpertWeights& w, const float* xn, std::size_t n, float* out);
  void dense_mlp(std::size_t layer, const std::vector<float>& xn, std::size_t n, std::vector<float>& out);

  std::shared_ptr<const Checkpoint> owned_;
  const Checkpoint& ck_;
  const ModelDescription& d_;
  std::size_t threads_ = 1;
  DequantizedWeights weights_;  // the linears as fp32-readable refs (quantised ones dequantised at load)
  KvDtype kv_dtype_ = KvDtype::bf16;
  std::vector<float> final_norm_;
  std::vector<NormWeights> norms_;
  std::vector<float> inv_freq_;     // (rotary_dim / 2) RoPE inverse frequencies (YaRN-blended when scaled)
  float rope_scale_ = 1.0f;         // YaRN attention factor on cos/sin; 1 without scaling
  KvPoolShape pool_;                // shape of the allocated pool (num_blocks 0: none yet)
  std::vector<std::uint16_t> kv16_;  // the pool when kv_dtype_ is bf16 (layout: header comment)
  std::vector<float> kv32_;          // the pool when kv_dtype_ is f32
  std::size_t pool_allocations_ = 0;
  std::vector<float> k_ctx_, v_ctx_;  // (context, kv_dim) fp32: one layer's K and V read back, reused
};

void CpuBackend::allocate_kv_pool(const KvPoolShape& shape) {
  if (shape.num_blocks == 0 || shape.block_tokens == 0)
    throw std::invalid_argument("KV pool of " + std::to_string(shape.num_blocks) + " blocks of " +
                                std::to_string(shape.block_tokens) + " tokens: expected at least one block of at least one token");
  const std::size_t elems = shape.tokens() * static_cast<std::size_t>(d_.num_layers) * 2 * kv_dim();
  pool_ = KvPoolShape{};
  std::vector<std::uint16_t>().swap(kv16_);
  std::vector<float>().swap(kv32_);
  if (kv_dtype_ == KvDtype::bf16)
    kv16_.assign(elems, 0);
  else
    kv32_.assign(elems, 0.0f);
  pool_ = shape;
  ++pool_allocations_;
}

void CpuBackend::store_row(const KvView& kv, std::size_t layer, std::size_t which, std::size_t pos, const float* src) {
  const std::size_t off = kv_offset(kv.blocks[pos / pool_.block_tokens], layer, which, pos % pool_.block_tokens);
  const std::size_t kvd = kv_dim();
  if (kv_dtype_ == KvDtype::bf16) {
    for (std::size_t j = 0; j < kvd; ++j) kv16_[off + j] = cpu::f32_to_bf16(src[j]);
  } else {
    std::copy(src, src + kvd, kv32_.begin() + static_cast<std::ptrdiff_t>(off));
  }
}

void CpuBackend::gather(const KvView& kv, std::size_t layer, std::size_t len) {
  const std::size_t kvd = kv_dim(), bt = pool_.block_tokens;
  if (k_ctx_.size() < len * kvd) {
    k_ctx_.resize(len * kvd);
    v_ctx_.resize(len * kvd);
  }
  for (std::size_t p0 = 0; p0 < len; p0 += bt) {
    const std::size_t rows = std::min(bt, len - p0);  // a block's rows of one layer are contiguous
    const int32_t block = kv.blocks[p0 / bt];
    for (std::size_t which = 0; which < 2; ++which) {
      float* dst = (which == 0 ? k_ctx_ : v_ctx_).data() + p0 * kvd;
      const std::size_t off = kv_offset(block, layer, which, 0);
      if (kv_dtype_ == KvDtype::bf16) {
        const std::uint16_t* src = kv16_.data() + off;
        for (std::size_t j = 0; j < rows * kvd; ++j) dst[j] = cpu::bf16_to_f32(src[j]);
      } else {
        std::copy(kv32_.data() + off, kv32_.data() + off + rows * kvd, dst);
      }
    }
  }
}

void CpuBackend::attention(std::size_t layer, const KvView& kv, std::size_t n, std::vector<float>& xn,
                           std::vector<float>& out) {
  const std::size_t p0 = kv.length;
  const auto& L = weights_.layers()[layer];
  const auto& nw = norms_[layer];
  const auto hd = static_cast<std::size_t>(d_.head_dim);
  const auto nh = static_cast<std::size_t>(d_.num_heads);
  const auto nkv = static_cast<std::size_t>(d_.num_kv_heads);
  const std::size_t qd = nh * hd, kvd = nkv * hd;
  std::vector<float> q(n * qd), k(n * kvd), v(n * kvd);
  matmul(L.q_proj, xn.data(), n, q.data(), threads_);
  matmul(L.k_proj, xn.data(), n, k.data(), threads_);
  matmul(L.v_proj, xn.data(), n, v.data(), threads_);
  const auto rot = static_cast<std::size_t>(d_.rotary_dim());
  for (std::size_t t = 0; t < n; ++t) {
    float* qt = q.data() + t * qd;
    float* kt = k.data() + t * kvd;
    if (d_.attention_bias) {
      float* vt = v.data() + t * kvd;
      for (std::size_t j = 0; j < qd; ++j) qt[j] += nw.q_bias[j];
      for (std::size_t j = 0; j < kvd; ++j) kt[j] += nw.k_bias[j];
      for (std::size_t j = 0; j < kvd; ++j) vt[j] += nw.v_bias[j];
    }
    if (d_.qk_norm) {
      cpu::rms_norm(qt, nw.q.data(), nh, hd, d_.rms_norm_eps, qt);
      cpu::rms_norm(kt, nw.k.data(), nkv, hd, d_.rms_norm_eps, kt);
    }
    const auto pos = static_cast<std::int64_t>(p0 + t);
    cpu::rope(qt, nh, hd, rot, pos, inv_freq_.data(), rope_scale_);
    cpu::rope(kt, nkv, hd, rot, pos, inv_freq_.data(), rope_scale_);
    store_row(kv, layer, 0, p0 + t, kt);
    store_row(kv, layer, 1, p0 + t, v.data() + t * kvd);
  }
  gather(kv, layer, p0 + n);
  // Causal GQA: query head h reads KV head h / (nh / nkv); token t sees positions [0, p0 + t].
  const std::size_t group = nh / nkv;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  std::vector<float> attn(n * qd);
  const std::size_t work = n * nh * (p0 + n) * hd * 2;
  parallel_for(n * nh, threads_, work, [&](std::size_t b, std::size_t e) {
    std::vector<float> scores(p0 + n);
    for (std::size_t i = b; i < e; ++i) {
      const std::size_t t = i / nh, h = i % nh, kvh = h / group;
      const float* qv = q.data() + t * qd + h * hd;
      const std::size_t len = p0 + t + 1;
      float mx = -std::numeric_limits<float>::infinity();
      for (std::size_t p = 0; p < len; ++p) {
        scores[p] = cpu::dot(qv, k_ctx_.data() + p * kvd + kvh * hd, hd) * scale;
        mx = std::max(mx, scores[p]);
      }
      double sum = 0;
      for (std::size_t p = 0; p < len; ++p) {
        scores[p] = std::exp(scores[p] - mx);
        sum += scores[p];
      }
      const auto inv = static_cast<float>(1.0 / sum);
      float* o = attn.data() + t * qd + h * hd;
      std::fill(o, o + hd, 0.0f);
      for (std::size_t p = 0; p < len; ++p) {
        const float w = scores[p] * inv;
        const float* vv = v_ctx_.data() + p * kvd + kvh * hd;
        for (std::size_t j = 0; j < hd; ++j) o[j] += w * vv[j];
      }
    }
  });
  matmul(L.o_proj, attn.data(), n, out.data(), threads_);
}

void CpuBackend::swiglu(const ExpertWeights& w, const float* xn, std::size_t n, float* out) {
  const auto m = static_cast<std::size_t>(w.gate.info->shape[0]);
  std::vector<float> g(n * m), u(n * m);
  matmul(w.gate, xn, n, g.data(), threads_);
  matmul(w.up, xn, n, u.data(), threads_);
  for (std::size_t i = 0; i < n * m; ++i) g[i] = cpu::silu(g[i]) * u[i];
  matmul(w.down, g.data(), n, out, threads_);
}

void CpuBackend::dense_mlp(std::size_t layer, const std::vector<float>& xn, std::size_t n, std::vector<float>& out) {
  const auto& L = weights_.layers()[layer];
  swiglu(ExpertWeights{L.mlp_gate, L.mlp_up, L.mlp_down}, xn.data(), n, out.data());
}

void CpuBackend::route_softmax(float* lr, std::size_t t,
                               std::vector<std::vector<std::pair<std::size_t, float>>>& by_expert) const {
  // Qwen3-MoE: softmax over all experts, top-k (ties to the lower index), renormalise.
  const auto ne = static_cast<std::size_t>(d_.moe.num_experts);
  const auto k = static_cast<std::size_t>(d_.moe.top_k);
  const float mx = *std::max_element(lr, lr + ne);
  double sum = 0;
  for (std::size_t e = 0; e < ne; ++e) sum += std::exp(static_cast<double>(lr[e] - mx));
  for (std::size_t e = 0; e < ne; ++e) lr[e] = static_cast<float>(std::exp(static_cast<double>(lr[e] - mx)) / sum);
  std::vector<std::size_t> order(ne);
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(k), order.end(),
                    [&](std::size_t a, std::size_t b) { return lr[a] != lr[b] ? lr[a] > lr[b] : a < b; });
  float topsum = 0;
  for (std::size_t j = 0; j < k; ++j) topsum += lr[order[j]];
  for (std::size_t j = 0; j < k; ++j) {
    float w = lr[order[j]];
    if (d_.moe.norm_topk_prob) w /= topsum;
    by_expert[order[j]].emplace_back(t, w * static_cast<float>(d_.moe.routed_scaling_factor));
  }
}

void CpuBackend::route_sigmoid(std::size_t layer, const float* lr, std::size_t t,
                               std::vector<std::vector<std::pair<std::size_t, float>>>& by_expert) const {
  // glm4_moe (transformers Glm4MoeMoE.route_tokens_to_experts), in fp32.
  const auto ne = static_cast<std::size_t>(d_.moe.num_experts);
  const auto k = static_cast<std::size_t>(d_.moe.top_k);
  const auto groups = static_cast<std::size_t>(d_.moe.n_group);
  const std::size_t per_group = ne / groups;
  const std::vector<float>& bias = norms_[layer].router_bias;
  std::vector<float> score(ne), choice(ne);
  for (std::size_t e = 0; e < ne; ++e) {
    score[e] = 1.0f / (1.0f + std::exp(-lr[e]));
    choice[e] = score[e] + bias[e];  // the correction bias steers the choice only
  }
  auto higher = [](const std::vector<float>& v) {
    return [&v](std::size_t a, std::size_t b) { return v[a] != v[b] ? v[a] > v[b] : a < b; };
  };
  if (groups > 1) {
    // A group's score is the sum of its two best choices; experts outside the topk_group best
    // groups are masked to 0 (transformers' masked_fill value, not -inf).
    std::vector<float> group_score(groups);
    for (std::size_t g = 0; g < groups; ++g) {
      float best = -std::numeric_limits<float>::infinity(), second = best;
      for (std::size_t e = g * per_group; e < (g + 1) * per_group; ++e) {
        if (choice[e] > best) {
          second = best;
          best = choice[e];
        } else if (choice[e] > second) {
          second = choice[e];
        }
      }
      group_score[g] = best + second;
    }
    std::vector<std::size_t> gorder(groups);
    std::iota(gorder.begin(), gorder.end(), 0);
    const auto kept = static_cast<std::ptrdiff_t>(d_.moe.topk_group);
    std::partial_sort(gorder.begin(), gorder.begin() + kept, gorder.end(), higher(group_score));
    std::vector<bool> keep(groups, false);
    for (std::ptrdiff_t j = 0; j < kept; ++j) keep[gorder[static_cast<std::size_t>(j)]] = true;
    for (std::size_t e = 0; e < ne; ++e)
      if (!keep[e / per_group]) choice[e] = 0.0f;
  }
  std::vector<std::size_t> order(ne);
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(k), order.end(), higher(choice));
  float topsum = 0;
  for (std::size_t j = 0; j < k; ++j) topsum += score[order[j]];
  for (std::size_t j = 0; j < k; ++j) {
    float w = score[order[j]];
    if (d_.moe.norm_topk_prob) w /= topsum + 1e-20f;
    by_expert[order[j]].emplace_back(t, w * static_cast<float>(d_.moe.routed_scaling_factor));
  }
}

void CpuBackend::moe(std::size_t layer, const std::vector<float>& xn, std::size_t n, std::vector<float>& out) {
  const auto& L = weights_.layers()[layer];
  const auto h = static_cast<std::size_t>(d_.hidden_size);
  const auto ne = static_cast<std::size_t>(d_.moe.num_experts);
  // Router logits in fp32 from the stored weights (transformers: F.linear in fp32).
  std::vector<float> logits(n * ne);
  matmul(L.router, xn.data(), n, logits.data(), threads_);
  std::vector<std::vector<std::pair<std::size_t, float>>> by_expert(ne);  // expert -> (token, weight)
  for (std::size_t t = 0; t < n; ++t) {
    if (d_.moe.router == RouterKind::softmax_topk)
      route_softmax(logits.data() + t * ne, t, by_expert);
    else
      route_sigmoid(layer, logits.data() + t * ne, t, by_expert);
  }
  std::fill(out.begin(), out.end(), 0.0f);
  std::vector<float> xs, y;
  for (std::size_t e = 0; e < ne; ++e) {
    const auto& routed = by_expert[e];
    if (routed.empty()) continue;
    const std::size_t c = routed.size();
    xs.resize(c * h);
    for (std::size_t i = 0; i < c; ++i)
      std::copy(xn.begin() + static_cast<std::ptrdiff_t>(routed[i].first * h),
                xn.begin() + static_cast<std::ptrdiff_t>((routed[i].first + 1) * h), xs.begin() + static_cast<std::ptrdiff_t>(i * h));
    y.resize(c * h);
    swiglu(L.experts[e], xs.data(), c, y.data());
    for (std::size_t i = 0; i < c; ++i) {
      float* o = out.data() + routed[i].first * h;
      const float w = routed[i].second;
      for (std::size_t j = 0; j < h; ++j) o[j] += w * y[i * h + j];
    }
  }
  if (d_.moe.shared_experts > 0) {  // glm4_moe: one SwiGLU of n_shared_experts x moe width, always on
    y.resize(n * h);
    swiglu(L.shared, xn.data(), n, y.data());
    for (std::size_t i = 0; i < n * h; ++i) out[i] += y[i];
  }
}

std::vector<float> CpuBackend::forward(const KvView& kv, std::span<const int32_t> tokens, bool all_logits) {
  if (pool_.num_blocks == 0) throw std::logic_error("CpuBackend::forward before allocate_kv_pool: no KV pool");
  const std::size_t n = tokens.size();
  const std::size_t p0 = kv.length;
  const std::size_t capacity = kv.blocks.size() * pool_.block_tokens;
  if (p0 + n > capacity)
    throw KvCacheFull("KV cache full: " + std::to_string(p0) + " cached + " + std::to_string(n) +
                      " new tokens = " + std::to_string(p0 + n) + " exceeds the capacity of " +
                      std::to_string(capacity) + " tokens (" + std::to_string(capacity * kv_bytes_per_token()) + " bytes)");
  if (n == 0) return {};
  for (std::size_t i = 0; i * pool_.block_tokens < p0 + n; ++i)
    if (kv.blocks[i] < 0 || static_cast<std::size_t>(kv.blocks[i]) >= pool_.num_blocks)
      throw std::out_of_range("block table entry " + std::to_string(i) + " = " + std::to_string(kv.blocks[i]) +
                              " is outside the KV pool of " + std::to_string(pool_.num_blocks) + " blocks");
  const auto h = static_cast<std::size_t>(d_.hidden_size);
  const auto vocab = static_cast<std::size_t>(d_.vocab_size);
  for (auto t : tokens)
    if (t < 0 || static_cast<std::size_t>(t) >= vocab)
      throw std::out_of_range("token id " + std::to_string(t) + " is outside the vocabulary [0, " +
                              std::to_string(vocab) + ")");

  std::vector<float> x(n * h), xn(n * h), tmp(n * h);
  for (std::size_t t = 0; t < n; ++t) to_f32(ck_.embed_tokens(), static_cast<std::size_t>(tokens[t]) * h, h, x.data() + t * h);

  for (std::size_t l = 0; l < static_cast<std::size_t>(d_.num_layers); ++l) {
    cpu::rms_norm(x.data(), norms_[l].input.data(), n, h, d_.rms_norm_eps, xn.data());
    attention(l, kv, n, xn, tmp);
    for (std::size_t i = 0; i < n * h; ++i) x[i] += tmp[i];
    cpu::rms_norm(x.data(), norms_[l].post.data(), n, h, d_.rms_norm_eps, xn.data());
    if (d_.layers[l].mlp == MlpKind::moe) {
      moe(l, xn, n, tmp);
    } else {
      dense_mlp(l, xn, n, tmp);
    }
    for (std::size_t i = 0; i < n * h; ++i) x[i] += tmp[i];
  }

  const std::size_t first = all_logits ? 0 : n - 1;
  const std::size_t rows = n - first;
  cpu::rms_norm(x.data() + first * h, final_norm_.data(), rows, h, d_.rms_norm_eps, xn.data());
  std::vector<float> logits(rows * vocab);
  matmul(weights_.lm_head(), xn.data(), rows, logits.data(), threads_);
  return logits;
}

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(const Checkpoint& checkpoint, CpuBackendOptions options) {
  return std::make_unique<CpuBackend>(checkpoint, options, nullptr);
}

std::unique_ptr<Backend> make_cpu_backend(const std::string& dir, CpuBackendOptions options) {
  auto owned = std::make_shared<const Checkpoint>(Checkpoint::open(dir));
  const Checkpoint& ref = *owned;
  return std::make_unique<CpuBackend>(ref, options, std::move(owned));
}

}  // namespace servedeck::worker
