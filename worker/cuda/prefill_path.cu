// The chunked prefill path of the CUDA backend (issue 8, section 4).
//
// Per chunk of n tokens at positions [pos0, pos0 + n), per layer:
//   RMSNorm rows → bf16; q|k|v GEMM (cuBLAS, bf16 in, fp32 out, fp32 compute); q/k-norm + RoPE
//   + K/V append into the paged bf16 pool; the layer's context rows [0, pos0 + n) gathered from
//   the pool into one contiguous copy; attention of the chunk against it (flash_attention.cuh:
//   bf16 tensor cores, scores kept on chip; or, for other head sizes / when turned off, per KV
//   head: S = K·Qᵀ strided-batched over its query heads, causal softmax, O = P·V, TF32 tensor
//   cores on an fp32 copy); o-proj GEMM accumulated into the residual; RMSNorm
//   rows; router logits from the fp32 normalised rows (as decode: a bf16-rounded router input
//   flips near-tied choices) + top-k (softmax, or glm4_moe's sigmoid router: router_sigmoid.cuh).
//   glm4_moe: the q|k|v bias is added with the RoPE pass, and the shared expert runs as a dense
//   SwiGLU of the chunk (shared_expert.cu) before the routed experts.
//   MoE: the routing ids come back to the host (the expert GEMM sizes are host arguments), rows
//   are sorted by expert (stable in token order), gathered, and each routed expert runs gate|up
//   GEMM → SwiGLU → down GEMM into fp32 partial rows. Hot experts are read from the VRAM cache in
//   place; the others are copied in groups of `stage_group` experts through a ring of
//   `stage_buffers` VRAM staging buffers on a copy stream, up to that many groups ahead of
//   compute (events order buffer reuse). A long chunk routes in two parts (the first quarter of
//   its rows, then the rest): the first part's experts copy while the second part's attention
//   runs. Finally each token's k partials are reduced once, in slot order j = 0..k-1, in fp32
//   (the notes found per-group bf16 partial sums not equivalent).
#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "worker/cuda/backend_impl.cuh"
#include "worker/cuda/flash_attention.cuh"
#include "worker/cuda/kernels.cuh"
#include "worker/cuda/prefill.cuh"

namespace servedeck::worker::cuda {

namespace detail {

PrefillBuffers::~PrefillBuffers() {
  for (void* p : owned) cudaFree(p);
  if (h_ids) cudaFreeHost(h_ids);
  if (h_rank) cudaFreeHost(h_rank);
  if (h_offset) cudaFreeHost(h_offset);
}

}  // namespace detail

namespace {

using bf16 = __nv_bfloat16;

void cublas_check(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS)
    throw std::runtime_error(std::string("cuda backend prefill: ") + what + " failed with cuBLAS status " +
                             std::to_string(static_cast<int>(s)));
}

/// Queries per attention sub-chunk: the scores buffer holds (group × this × cache capacity) floats.
constexpr int k_attn_query_block = 512;

}  // namespace

void CudaBackend::Impl::gemm(const bf16* W, int out, int in, const bf16* X, int n, int ldx, float* Y, int ldy, float beta) {
  const float alpha = 1.f;
  // Row-major Y (n, out) = X (n, in) · Wᵀ, i.e. column-major Yᵀ (out, n) = op(W) · Xᵀ.
  cublas_check(cublasGemmEx(cublas, CUBLAS_OP_T, CUBLAS_OP_N, out, n, in, &alpha, W, CUDA_R_16BF, in, X, CUDA_R_16BF, ldx,
                            &beta, Y, CUDA_R_32F, ldy, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
               "cublasGemmEx");
}

bool CudaBackend::Impl::use_flash_attention() const {
  // One warp per query head of a GQA group and one block per multiprocessor at head_dim 128:
  // groups below 4 would leave it nearly idle (measured only at group 8).
  const int heads = static_cast<int>(d.num_heads), kv_heads = static_cast<int>(d.num_kv_heads);
  return opt.flash_attention && flash_attention_supported(heads, kv_heads, static_cast<int>(d.head_dim)) && heads / kv_heads >= 4;
}

std::size_t CudaBackend::Impl::score_columns(std::size_t capacity) const {
  // With flash attention on, the cuBLAS path serves only chunks ending within min_keys keys.
  const std::size_t min_keys = static_cast<std::size_t>(std::max(opt.flash_attention_min_keys, 1));
  return use_flash_attention() ? std::min(capacity, min_keys) : capacity;
}

void CudaBackend::Impl::ensure_prefill_buffers(int chunk, std::size_t capacity) {
  // Flash attention may be turned on after the buffers were sized without it (set_flash_attention).
  if (pre.chunk >= chunk && pre.capacity >= capacity && pre.scores_ld >= score_columns(capacity) &&
      (pre.k_b != nullptr || !use_flash_attention()))
    return;
  CUDA_CHECK(cudaStreamSynchronize(stream));
  CUDA_CHECK(cudaStreamSynchronize(copy_stream));
  chunk = std::max(chunk, pre.chunk);
  capacity = std::max(capacity, pre.capacity);
  // Sized again only at the end: an allocation that throws below leaves "no buffers", so that a
  // later call reallocates instead of taking the early return above with the freed pointers.
  pre.chunk = 0;
  pre.capacity = 0;
  for (void* p : pre.owned) CUDA_CHECK(cudaFree(p));
  pre.owned.clear();
  pre.k_b = pre.v_b = nullptr;
  pre.k32 = pre.v32 = nullptr;
  for (int32_t** h : {&pre.h_ids, &pre.h_rank, &pre.h_offset}) {
    if (*h) CUDA_CHECK(cudaFreeHost(*h));
    *h = nullptr;
  }

  const std::size_t n = static_cast<std::size_t>(chunk), H = static_cast<std::size_t>(hidden());
  const std::size_t K = static_cast<std::size_t>(std::max<int64_t>(d.moe.top_k, 1));
  const std::size_t E = static_cast<std::size_t>(std::max<int64_t>(d.moe.num_experts, 1));
  const std::size_t Im = static_cast<std::size_t>(std::max<int64_t>(d.moe.intermediate_size, 8));
  const std::size_t Id = static_cast<std::size_t>(std::max<int64_t>(d.intermediate_size, 8));
  const std::size_t Is = static_cast<std::size_t>(shared_inter());  // the shared expert's gate|up and SwiGLU rows
  const std::size_t group = static_cast<std::size_t>(d.num_heads / d.num_kv_heads);
  const std::size_t qb = std::min<std::size_t>(n, k_attn_query_block);
  auto alloc = [&](std::size_t bytes) {
    void* p = device_alloc(std::max<std::size_t>(bytes, 256));
    pre.owned.push_back(p);
    return p;
  };
  pre.x = static_cast<float*>(alloc(n * H * 4));
  pre.xb = static_cast<bf16*>(alloc(n * H * 2));
  pre.xn32 = static_cast<float*>(alloc(n * H * 4));
  pre.qkv = static_cast<float*>(alloc(n * static_cast<std::size_t>(qkv_dim()) * 4));
  pre.attn = static_cast<float*>(alloc(n * static_cast<std::size_t>(q_dim()) * 4));
  pre.attn_b = static_cast<bf16*>(alloc(n * static_cast<std::size_t>(q_dim()) * 2));
  // The cuBLAS path's materialised scores: group × 512 queries × key columns floats (268 MB for a
  // 16k cache without flash attention; at most 8192 columns with it).
  pre.scores_ld = score_columns(capacity);
  pre.scores = static_cast<float*>(alloc(group * qb * pre.scores_ld * 4));
  pre.k32 = static_cast<float*>(alloc(pre.scores_ld * static_cast<std::size_t>(kv_dim()) * 4));
  pre.v32 = static_cast<float*>(alloc(pre.scores_ld * static_cast<std::size_t>(kv_dim()) * 4));
  if (use_flash_attention()) {
    const std::size_t kv = capacity * static_cast<std::size_t>(kv_dim());
    pre.k_b = static_cast<bf16*>(alloc(kv * 2));
    pre.v_b = static_cast<bf16*>(alloc(kv * 2));
  }
  pre.logits = static_cast<float*>(alloc(n * E * 4));
  pre.route_w = static_cast<float*>(alloc(n * K * 4));
  pre.ids = static_cast<int32_t*>(alloc(n * K * 4));
  pre.src = static_cast<int32_t*>(alloc(n * K * 4));
  pre.slot = static_cast<int32_t*>(alloc(n * K * 4));
  pre.tokens = static_cast<int32_t*>(alloc(n * 4));
  pre.xp = static_cast<bf16*>(alloc(n * K * H * 2));
  pre.gu = static_cast<float*>(alloc(std::max({n * K * 2 * Im, n * 2 * Id, n * 2 * Is}) * 4));
  pre.act = static_cast<bf16*>(alloc(std::max({n * K * Im, n * Id, n * Is}) * 2));
  pre.partial = static_cast<float*>(alloc(n * K * H * 4));
  pre.stage.clear();
  if (store)
    for (std::size_t b = 0; b < stage_ready.size(); ++b) pre.stage.push_back(static_cast<bf16*>(alloc(stage_group * store->block_bytes())));
  if (store && store->format() != ExpertFormat::bf16)
    pre.dequant = static_cast<bf16*>(alloc(stage_group * 3 * static_cast<std::size_t>(H) * static_cast<std::size_t>(Im) * 2));
  pre.h_ids = static_cast<int32_t*>(host_alloc(n * K * sizeof(int32_t)));
  pre.h_rank = static_cast<int32_t*>(host_alloc(n * K * sizeof(int32_t), cudaHostAllocMapped));
  pre.h_offset = static_cast<int32_t*>(host_alloc(E * sizeof(int32_t), cudaHostAllocMapped));
  CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&pre.h_rank_dev), pre.h_rank, 0));
  CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&pre.h_offset_dev), pre.h_offset, 0));

  pre.chunk = chunk;
  pre.capacity = capacity;
}

void CudaBackend::Impl::prefill(std::size_t pos0, std::span<const int32_t> tokens, bool all_logits, std::vector<float>& out) {
  const int chunk = std::max(1, opt.prefill_chunk);
  const std::size_t n = tokens.size();
  // Sized with the pool (allocate_pool): a no-op unless set_flash_attention changed what they need.
  ensure_prefill_buffers(static_cast<int>(std::min<std::size_t>(n, static_cast<std::size_t>(chunk))), pool.tokens());
  const std::size_t H = static_cast<std::size_t>(hidden());
  std::size_t at = pos0;
  for (std::size_t start = 0; start < n; start += static_cast<std::size_t>(chunk)) {
    const std::size_t cnt = std::min<std::size_t>(static_cast<std::size_t>(chunk), n - start);
    prefill_chunk(tokens.subspan(start, cnt), static_cast<int>(at));
    at += cnt;
    if (all_logits) {
      for (std::size_t r = 0; r < cnt; ++r) logits_row(pre.x + r * H, out);
    } else if (start + cnt == n) {
      logits_row(pre.x + (cnt - 1) * H, out);
    }
  }
  CUDA_CHECK(cudaStreamSynchronize(stream));
}

void CudaBackend::Impl::prefill_chunk(std::span<const int32_t> toks, int pos0) {
  const int n = static_cast<int>(toks.size()), H = hidden();
  const float eps = static_cast<float>(d.rms_norm_eps);
  const AttentionShape shape = attention_shape();
  const bool flash = use_flash_attention() && pos0 + n > opt.flash_attention_min_keys;
  CUDA_CHECK(cudaMemcpyAsync(pre.tokens, toks.data(), toks.size() * sizeof(int32_t), cudaMemcpyHostToDevice, stream));
  launch_embed_rows(embed, pre.tokens, pre.x, n, H, stream);
  prefill_profile.begin(static_cast<int>(layers.size()));
  for (std::size_t li = 0; li < layers.size(); ++li) {
    const detail::LayerDev& L = layers[li];
    const int l = static_cast<int>(li);
    if (L.moe) prefill_profile.mark(l, 0, stream);
    launch_rmsnorm_rows_bf16(pre.x, L.input_norm, pre.xb, n, H, eps, stream);
    gemm(L.qkv, qkv_dim(), H, pre.xb, n, H, pre.qkv, qkv_dim(), 0.f);
    const PagedKv kv = layer_kv(l);
    launch_qk_rope_append_rows(pre.qkv, L.q_norm, L.k_norm, kv, shape, n, pos0, stream, L.qkv_bias);
    // The attention kernels read the layer's context contiguously: one gather pass over the
    // pool's rows (the flash kernel's bf16 tiles, or fp32 for cuBLAS; at 64K positions 128 MB
    // per layer, a few percent of the chunk's attention time).
    if (flash) launch_gather_kv_rows(kv, kv_dim(), pos0 + n, pre.k_b, pre.v_b, stream);
    else launch_gather_kv_rows(kv, kv_dim(), pos0 + n, pre.k32, pre.v32, stream);
    // A long chunk's MoE layer runs attention → router for the first quarter of its rows, then
    // for the rest: the experts the first part routes to copy while the second part computes.
    // (A chunk too short to leave rows on both sides of the quarter is not split.)
    const int quarter = (n / 4 + 15) / 16 * 16;
    const bool split = L.moe && opt.prefill_split_min_tokens > 0 && n >= opt.prefill_split_min_tokens && quarter > 0 && quarter < n;
    const int split_row = split ? quarter : n;
    if (L.moe) prefill_profile.mark(l, 1, stream);
    prefill_attention(0, split_row, pos0, flash);
    prefill_attention_out(l, 0, split_row, 0);
    if (split) {
      prefill_attention(split_row, n, pos0, flash);
      prefill_attention_out(l, split_row, n, 1);
    }
    if (L.moe) {
      // The shared expert (glm4_moe) first: the GPU computes it while the host waits for the
      // routing ids in prefill_moe.
      shared_expert_prefill(L, n);
      prefill_profile.mark(l, 2, stream);
      prefill_moe(moe_index[li], n, split ? 2 : 1, split_row, l);
    } else {
      const int I = static_cast<int>(d.intermediate_size);
      gemm(L.mlp_gate, I, H, pre.xb, n, H, pre.gu, 2 * I, 0.f);
      gemm(L.mlp_up, I, H, pre.xb, n, H, pre.gu + I, 2 * I, 0.f);
      launch_swiglu_rows_bf16(pre.gu, pre.act, n, I, stream);
      gemm(L.mlp_down, H, I, pre.act, n, I, pre.x, H, 1.f);
    }
  }
  prefill_profile.report(n, static_cast<int>(layers.size()));
}

void CudaBackend::Impl::prefill_attention(int r0, int r1, int pos0, bool flash) {
  const int hd = static_cast<int>(d.head_dim), group = static_cast<int>(d.num_heads / d.num_kv_heads);
  if (flash) {
    launch_flash_attention_prefill(pre.qkv + static_cast<std::size_t>(r0) * qkv_dim(), qkv_dim(), pre.k_b, pre.v_b,
                                   pre.attn + static_cast<std::size_t>(r0) * q_dim(), q_dim(), r1 - r0, pos0 + r0,
                                   static_cast<int>(d.num_heads), static_cast<int>(d.num_kv_heads), hd, stream);
    return;
  }
  const int ld = static_cast<int>(pre.scores_ld);  // >= pos0 + n (score_columns)
  const int qb = std::min(r1 - r0, k_attn_query_block);
  const float scale = 1.f / std::sqrt(static_cast<float>(hd)), one = 1.f, zero = 0.f;
  for (int a = r0; a < r1; a += qb) {
    const int tq = std::min(qb, r1 - a), len = pos0 + a + tq;
    for (int kvh = 0; kvh < static_cast<int>(d.num_kv_heads); ++kvh) {
      // Scores, column-major (len, tq) per head = K_kvh (len, hd) · Q_hᵀ: row-major (tq, ld) per head.
      cublas_check(cublasGemmStridedBatchedEx(
                       cublas, CUBLAS_OP_T, CUBLAS_OP_N, len, tq, hd, &scale, pre.k32 + kvh * hd, CUDA_R_32F, kv_dim(), 0,
                       pre.qkv + static_cast<std::size_t>(a) * qkv_dim() + static_cast<std::size_t>(kvh) * group * hd,
                       CUDA_R_32F, qkv_dim(), hd, &zero, pre.scores, CUDA_R_32F, ld,
                       static_cast<long long>(tq) * ld, group, CUBLAS_COMPUTE_32F_FAST_TF32, CUBLAS_GEMM_DEFAULT),
                   "attention scores");
      launch_causal_softmax_rows(pre.scores, group * tq, tq, len, ld, pos0 + a, stream);
      // Output, column-major (hd, tq) per head = V_kvh (hd, len) · P (len, tq).
      cublas_check(cublasGemmStridedBatchedEx(
                       cublas, CUBLAS_OP_N, CUBLAS_OP_N, hd, tq, len, &one, pre.v32 + kvh * hd, CUDA_R_32F, kv_dim(), 0,
                       pre.scores, CUDA_R_32F, ld, static_cast<long long>(tq) * ld, &zero,
                       pre.attn + static_cast<std::size_t>(a) * q_dim() + static_cast<std::size_t>(kvh) * group * hd,
                       CUDA_R_32F, q_dim(), hd, group, CUBLAS_COMPUTE_32F_FAST_TF32, CUBLAS_GEMM_DEFAULT),
                   "attention output");
    }
  }
}

void CudaBackend::Impl::prefill_attention_out(int l, int r0, int r1, int part) {
  const detail::LayerDev& L = layers[static_cast<std::size_t>(l)];
  const int m = r1 - r0, H = hidden(), E = static_cast<int>(d.moe.num_experts), K = static_cast<int>(d.moe.top_k);
  const std::size_t r = static_cast<std::size_t>(r0);
  launch_to_bf16(pre.attn + r * q_dim(), pre.attn_b + r * q_dim(), static_cast<std::size_t>(m) * q_dim(), stream);
  gemm(L.o, H, q_dim(), pre.attn_b + r * q_dim(), m, q_dim(), pre.x + r * H, H, 1.f);  // residual: beta = 1
  launch_rmsnorm_rows_bf16(pre.x + r * H, L.post_norm, pre.xb + r * H, m, H, static_cast<float>(d.rms_norm_eps), stream,
                           L.moe ? pre.xn32 + r * H : nullptr);
  if (!L.moe) return;
  const int si = moe_index[static_cast<std::size_t>(l)];
  launch_router_logits_rows(L.router, pre.xn32 + r * H, pre.logits + r * E, m, E, H, stream);
  const uint8_t* hot = store->device_hot_flags() + static_cast<std::size_t>(si) * E;
  unsigned long long* lc = layer_counts + static_cast<std::size_t>(si) * E;
  if (d.moe.router == RouterKind::sigmoid_bias_topk)
    launch_router_sigmoid_rows(pre.logits + r * E, m, E, K, sigmoid_router(L), pre.ids + r * K, pre.route_w + r * K, hot, counters, lc,
                               stream);
  else
    launch_router_topk_rows(pre.logits + r * E, m, E, K, d.moe.norm_topk_prob, pre.ids + r * K, pre.route_w + r * K, hot, counters,
                            lc, stream);
  // The expert GEMM sizes are host arguments: the part's ids go to the host, once per part.
  CUDA_CHECK(cudaMemcpyAsync(pre.h_ids + r * K, pre.ids + r * K, static_cast<std::size_t>(m) * K * sizeof(int32_t),
                             cudaMemcpyDeviceToHost, stream));
  CUDA_CHECK(cudaEventRecord(ids_ready[part], stream));
}

void CudaBackend::Impl::prefill_moe(int si, int n, int parts, int split_row, int layer) {
  const int E = static_cast<int>(d.moe.num_experts), K = static_cast<int>(d.moe.top_k), H = hidden();
  const std::size_t rows = static_cast<std::size_t>(n) * K, R = stage_ready.size(), G = stage_group;
  const std::size_t block_elems = store->block_bytes() / sizeof(bf16);
  // Routed experts in compute order: those the first part routes to, by id, then those only the
  // second part routes to; batches of up to G consecutive ones, never spanning the two parts (so
  // the first part's can be staged before the second part's ids exist). The order and the
  // batches do not depend on which experts are hot, so offload on and off run the same GEMMs
  // and SwiGLU launches. A batch's cold experts form one staging group.
  std::vector<int> order;
  std::vector<std::size_t> batch_begin;  // index into order of each batch's first expert
  std::vector<std::size_t> staged;       // batches with cold experts, in order: staging group s = staged[s]
  std::vector<char> planned(static_cast<std::size_t>(E), 0);
  // Rows per expert, and each row's rank among its expert's rows in token order (p = t·K + j;
  // the first part's rows precede the second's), written to mapped memory for the scatter
  // kernel below. Written here while no kernel reads them: the previous layer's scatter finished
  // before this layer's router (which needs its output) produced the ids read here.
  std::vector<int> count(static_cast<std::size_t>(E), 0);
  int32_t* const rank = pre.h_rank;
  auto batch_end = [&](std::size_t bi) { return bi + 1 < batch_begin.size() ? batch_begin[bi + 1] : order.size(); };
  auto plan = [&](std::size_t p0, std::size_t p1) {
    std::vector<char> routed(static_cast<std::size_t>(E), 0);
    for (std::size_t p = p0; p < p1; ++p) {
      const std::size_t e = static_cast<std::size_t>(pre.h_ids[p]);
      routed[e] = 1;
      rank[p] = count[e]++;
    }
    const std::size_t first = order.size();
    for (int e = 0; e < E; ++e)
      if (routed[static_cast<std::size_t>(e)] && !planned[static_cast<std::size_t>(e)]) {
        planned[static_cast<std::size_t>(e)] = 1;
        order.push_back(e);
      }
    for (std::size_t i = first; i < order.size(); i += G) {
      batch_begin.push_back(i);
      for (std::size_t j = i; j < std::min(i + G, order.size()); ++j)
        if (store->vram_block(si, order[j]) == nullptr) {
          staged.push_back(batch_begin.size() - 1);
          break;
        }
    }
  };
  std::size_t issued = 0, computed = 0;  // staging groups whose copies / compute are enqueued
  auto issue_copies = [&]() {  // every planned group whose buffer's previous user (group − R) is enqueued
    for (; issued < staged.size() && issued < computed + R; ++issued) {
      const std::size_t b = issued % R, bi = staged[issued];
      CUDA_CHECK(cudaStreamWaitEvent(copy_stream, stage_free[b], 0));  // compute done with this buffer
      std::size_t k = 0;
      for (std::size_t i = batch_begin[bi]; i < batch_end(bi); ++i)
        if (store->vram_block(si, order[i]) == nullptr) {
          CUDA_CHECK(cudaMemcpyAsync(pre.stage[b] + k++ * block_elems, store->host_block(si, order[i]), store->block_bytes(),
                                     cudaMemcpyHostToDevice, copy_stream));
          staged_bytes += store->block_bytes();
        }
      CUDA_CHECK(cudaEventRecord(stage_ready[b], copy_stream));
    }
  };
  // While the host waits for the first part's ids, the device computes the second part.
  CUDA_CHECK(cudaEventSynchronize(ids_ready[0]));
  plan(0, static_cast<std::size_t>(parts == 2 ? split_row : n) * K);
  issue_copies();
  if (parts == 2) {
    CUDA_CHECK(cudaEventSynchronize(ids_ready[1]));
    plan(static_cast<std::size_t>(split_row) * K, rows);
    issue_copies();
  }

  // Rows sorted by compute order (so each batch's rows are contiguous), stable in token order:
  // expert e's rows start at offset[e] (mapped memory, read by the scatter kernel, which puts
  // row p at offset[ids[p]] + rank[p]). Only O(experts) host work after the last part's ids (the
  // host's per-row passes took 0.7-0.85 ms per 16k-token layer with the GPU idle, 2026-11-30).
  std::vector<int> offset(static_cast<std::size_t>(E), 0);
  {
    int at = 0;
    for (const int e : order) {
      offset[static_cast<std::size_t>(e)] = at;
      pre.h_offset[e] = at;
      at += count[static_cast<std::size_t>(e)];
    }
  }
  prefill_profile.mark(layer, 3, stream);
  launch_moe_scatter_rows(pre.ids, pre.h_rank_dev, pre.h_offset_dev, static_cast<int>(rows), K, E, pre.slot, pre.src, stream);
  launch_gather_rows_bf16(pre.xb, pre.src, pre.xp, static_cast<int>(rows), H, stream);

  std::size_t next_staged = 0;
  for (std::size_t bi = 0; bi < batch_begin.size(); ++bi) {
    const bool has_cold = next_staged < staged.size() && staged[next_staged] == bi;
    const std::size_t b = next_staged % R;
    detail::ExpertBatch batch;
    std::size_t k = 0;
    for (std::size_t i = batch_begin[bi]; i < batch_end(bi); ++i) {
      const int e = order[i];
      const bf16* hot = store->vram_block(si, e);
      batch.weights.push_back(hot != nullptr ? hot : pre.stage[b] + k++ * block_elems);
      batch.offsets.push_back(offset[static_cast<std::size_t>(e)]);
      batch.counts.push_back(count[static_cast<std::size_t>(e)]);
    }
    if (has_cold) CUDA_CHECK(cudaStreamWaitEvent(stream, stage_ready[b], 0));
    run_expert_batch(batch);
    if (has_cold) {
      CUDA_CHECK(cudaEventRecord(stage_free[b], stream));
      computed = ++next_staged;
      issue_copies();  // group + R reuses buffer b
    }
  }
  prefill_profile.mark(layer, 4, stream);
  launch_moe_reduce_rows(pre.partial, pre.slot, pre.route_w, n, K, H, pre.x, stream);
  prefill_profile.mark(layer, 5, stream);
}

}  // namespace servedeck::worker::cuda
