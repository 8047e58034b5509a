// Internals of the CUDA backend shared by cuda_backend.cu (load, decode step, forward) and
// prefill_path.cu (the chunked prefill with staged experts). Not a public header.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "worker/cuda/cuda_backend.hpp"
#include "worker/cuda/cuda_check.hpp"
#include "worker/cuda/fused.cuh"
#include "worker/cuda/router_sigmoid.cuh"
#include "worker/offload/expert_store.hpp"

namespace servedeck::worker::cuda {

namespace detail {

using bf16 = __nv_bfloat16;

/// Device weights of one layer. qkv: q, k and v projections concatenated at load into one
/// ((n_heads + 2 n_kv_heads) head_dim, hidden) matrix so one GEMV/GEMM computes all three.
/// With a YaRN attention factor m != 1 the rotated dims carry m from load on (fold_yarn_scale,
/// cuda_backend_load.cu): the q_norm / k_norm entries [0, rotary_dim) with QK-norm, else those
/// rows of q and k in qkv and in qkv_bias; RoPE then runs on plain cos/sin.
struct LayerDev {
  const bf16 *input_norm, *qkv, *o, *q_norm, *k_norm, *post_norm;
  const bf16 *router, *mlp_gate, *mlp_up, *mlp_down;
  bool moe;
  const float* router_folded = nullptr;  // (n_experts, hidden + q_dim) fp32, fold_router_weights; null: not folded
  const float* qkv_bias = nullptr;       // ((n_heads + 2 n_kv_heads) head_dim) fp32, VRAM; attention_bias only
  const float* router_bias = nullptr;    // (n_experts) fp32 e_score_correction_bias, VRAM; sigmoid router only
  const bf16* shared_gate_up = nullptr;  // (2 shared_inter, hidden) bf16 gate rows then up rows, VRAM; shared expert only
  const bf16* shared_down = nullptr;     // (hidden, shared_inter) bf16, VRAM
};

/// One batch of a prefill MoE layer's routed experts (at most stage_group, consecutive in the
/// compute order), computed as a gate|up GEMM per expert, one SwiGLU over its rows and a down
/// GEMM per expert. Expert j's rows (of pre.xp, gu, act and partial) start at offsets[j] and are
/// counts[j] long; the batch's rows are contiguous; weights[j] is the expert's gate|up|down block
/// in VRAM (hot cache or a staging buffer), in the expert store's format (a quantised one is
/// dequantised into PrefillBuffers::dequant before its GEMMs).
struct ExpertBatch {
  std::vector<const __nv_bfloat16*> weights;
  std::vector<int> offsets, counts;
};

/// Device buffers of the prefill path, sized for `chunk` tokens and sequences of up to
/// `capacity` positions (the pool's tokens: allocated with the pool, never per request).
struct PrefillBuffers {
  int chunk = 0;
  std::size_t capacity = 0;
  std::size_t scores_ld = 0;  // key columns of the cuBLAS path's score matrix and rows of k32 / v32 (0: none)
  std::vector<void*> owned;
  float *x = nullptr, *qkv = nullptr, *attn = nullptr, *scores = nullptr, *logits = nullptr, *route_w = nullptr;
  float *gu = nullptr, *partial = nullptr, *xn32 = nullptr;
  bf16 *xb = nullptr, *attn_b = nullptr, *xp = nullptr, *act = nullptr;
  bf16 *k_b = nullptr, *v_b = nullptr;    // flash attention: one layer's K and V rows gathered from the pool (capacity × kv_dim)
  float *k32 = nullptr, *v32 = nullptr;   // the cuBLAS path's: the same rows as fp32 (scores_ld × kv_dim)
  int32_t *tokens = nullptr, *ids = nullptr, *src = nullptr, *slot = nullptr;
  std::vector<bf16*> stage;  // staging buffers, stage_group experts each (blocks in the store's format)
  bf16* dequant = nullptr;   // quantised experts: stage_group bf16 blocks a batch's experts are dequantised into
  int32_t* h_ids = nullptr;  // pinned (chunk × top_k)
  // Pinned and mapped: each MoE row's rank among its expert's rows (chunk × top_k) and each
  // expert's first sorted row (n_experts), written by the host and read by the scatter kernel
  // (launch_moe_scatter_rows) through UVA, so they do not wait behind the staging copies.
  int32_t *h_rank = nullptr, *h_offset = nullptr;
  int32_t *h_rank_dev = nullptr, *h_offset_dev = nullptr;
  PrefillBuffers() = default;
  PrefillBuffers(const PrefillBuffers&) = delete;
  PrefillBuffers& operator=(const PrefillBuffers&) = delete;
  ~PrefillBuffers();
};

}  // namespace detail

namespace detail {

/// Per-phase GPU time of a prefill chunk, for the benchmark: with SERVEDECK_PREFILL_PROFILE=1
/// events are recorded on the compute stream at the phase boundaries of every MoE layer and the
/// sums over the layers go to stderr at the end of the chunk (one line); otherwise nothing is
/// recorded. Phases (points 0..5 of a layer): norm + q|k|v + RoPE/append (+ bf16 K/V copy) |
/// attention + o-proj + norm + router (both routing parts) | the host's planning of the experts
/// (the GPU waits for the ids, the plan and the first launches) | gather + expert GEMMs + SwiGLU
/// | reduce. A point is reached when the GPU gets there, so host stalls show as GPU time.
struct PrefillProfile {
  static constexpr int k_points = 6;
  bool on = false;
  std::vector<cudaEvent_t> ev;  // (layers × k_points)
  void begin(int layers);
  void mark(int layer, int point, cudaStream_t s) const;
  void report(int n, int layers) const;
  ~PrefillProfile();
};

}  // namespace detail

struct CudaBackend::Impl {
  using bf16 = __nv_bfloat16;
  ModelDescription d;
  CudaBackendOptions opt;
  cudaStream_t stream = nullptr;
  cudaStream_t copy_stream = nullptr;
  std::vector<cudaEvent_t> stage_ready, stage_free;  // per staging buffer (ring of opt.stage_buffers)
  cudaEvent_t ids_ready[2] = {nullptr, nullptr};     // a prefill part's routing ids are on the host
  detail::PrefillProfile prefill_profile;
  cublasHandle_t cublas = nullptr;
  char* arena = nullptr;  // resident weights, VRAM
  std::size_t arena_bytes = 0, arena_used = 0;
  const bf16* embed = nullptr;
  const bf16* lm_head = nullptr;
  const bf16* final_norm = nullptr;
  std::vector<detail::LayerDev> layers;
  std::vector<int> moe_index;  // layer → index in the expert store, -1 for dense
  std::unique_ptr<offload::ExpertStore> store;
  std::unique_ptr<Checkpoint> owned_checkpoint;  // make_cuda_backend_from_dir keeps it alive
  offload::ExpertProfile profile;
  bool have_profile = false;
  std::vector<std::string> warnings;
  // Decode activations (device).
  float *x, *xn, *qkv, *attn, *router_logits, *route_w, *act, *g, *u, *h, *logits;
  float* shared_gu = nullptr;   // (2 shared_inter) the shared expert's gate|up outputs; null without one
  float* shared_act = nullptr;  // (shared_inter) its SwiGLU
  int32_t *route_ids, *d_token, *d_pos;
  // The step's counters, one allocation zeroed once (handshakes.cuh): [0] the epoch, [1] the
  // unfolded router's last-block counter, then per MoE layer the heads (H2) and logits (H3)
  // counts, which only the folded layers use.
  unsigned int* step_counters = nullptr;
  unsigned int* router_done = nullptr;  // step_counters + 1
  /// Layer si's cross-grid counters (si: index in the expert store, moe_index).
  StepSync step_sync(int si) const;
  float* inv_freq = nullptr;  // RoPE table (rotary_dim / 2)
  float* attn_scratch = nullptr;            // fused decode attention partials
  unsigned int* attn_counters = nullptr;    // (n_heads), zero between launches
  float* x_alt = nullptr;                   // the residual stream's second buffer (decode with the folded router)
  float* router_folded = nullptr;           // every MoE layer's folded router (fold_router_weights), or null
  std::size_t router_folded_bytes = 0;
  unsigned long long *counters, *layer_counts;
  int32_t* h_scalars = nullptr;  // pinned: token, pos, the greedy pick
  int32_t* d_pick = nullptr;     // the decode step's argmax of the logits (launch_argmax_row)
  ArgmaxScratch argmax_scratch{};
  unsigned long long* top_k_partial = nullptr;  // launch_top_k_row's keys: top_k_blocks(V) · k_max_device_top_k
  TopKOut top_k_out{};                          // one allocation: k_max_device_top_k logits, ids, the count
  static constexpr std::size_t top_k_out_bytes() { return k_max_device_top_k * (sizeof(float) + sizeof(int32_t)) + sizeof(int); }
  float* h_logits = nullptr;     // pinned: vocab floats (or forward_top_k's copy, if larger)
  detail::PrefillBuffers pre;
  uint64_t staged_bytes = 0;     // host→device bytes copied by the prefill path
  std::size_t stage_group = 8;   // experts per staging buffer
  // The KV pool (allocate_kv_pool): per layer its K rows then its V rows, each (pool.tokens(),
  // kv_dim) bf16, one allocation; the block table of the sequence of the current pass (device,
  // pool.num_blocks entries) and its pinned mirror, of which table_len entries were uploaded.
  bf16* kv_pool = nullptr;
  KvPoolShape pool{};
  std::size_t pool_allocations = 0;
  int32_t* d_table = nullptr;
  int32_t* h_table = nullptr;
  std::size_t table_len = 0;
  int attn_splits = 1;           // blocks per KV head of the decode attention (attention_splits)
  // The decode step's graph: captured on the first decode step after the pool is allocated
  // (or PDL is switched), replayed for every later step of every sequence: it reads the token,
  // the position and the block table from device buffers.
  cudaGraphExec_t graph = nullptr;
  int32_t last_token = 0, last_pos = -1;  // the last decode step (decode_step_us)
  std::size_t allocations = 0;   // device and pinned host allocations made by this backend
  std::size_t graph_captures = 0;

  /// cudaMalloc (device) or cudaHostAlloc (pinned host, `flags`), counted in `allocations`.
  void* device_alloc(std::size_t bytes);
  void* host_alloc(std::size_t bytes, unsigned flags = cudaHostAllocDefault);
  /// Layer l's K and V in the pool, read through d_table.
  PagedKv layer_kv(int l) const;
  /// Checks a pass of n tokens over `kv` (KvCacheFull, std::out_of_range for a block id outside
  /// the pool) and uploads the table entries that differ from the last upload.
  void use_table(const KvView& kv, std::size_t n);
  /// Allocates the pool (and the prefill buffers for its tokens), replacing any earlier one.
  void allocate_pool(const KvPoolShape& shape);
  int hidden() const { return static_cast<int>(d.hidden_size); }
  int q_dim() const { return static_cast<int>(d.num_heads * d.head_dim); }
  int kv_dim() const { return static_cast<int>(d.num_kv_heads * d.head_dim); }
  int qkv_dim() const { return q_dim() + 2 * kv_dim(); }
  int rotary_dim() const;
  /// The shared expert's width (moe.shared_intermediate_size), 0 without one.
  int shared_inter() const { return static_cast<int>(d.moe.shared_experts > 0 ? d.moe.shared_intermediate_size : 0); }
  AttentionShape attention_shape() const;
  /// The sigmoid router's parameters for layer L (router_sigmoid.cuh).
  SigmoidRouter sigmoid_router(const detail::LayerDev& L) const {
    return SigmoidRouter{L.router_bias, static_cast<int>(d.moe.n_group), static_cast<int>(d.moe.topk_group), d.moe.norm_topk_prob,
                         static_cast<float>(d.moe.routed_scaling_factor)};
  }
  /// The shared expert of a MoE layer's decode step, if it has one (shared_expert.cu): out +=
  /// down(silu(gate xn) * up xn) for xn (hidden) fp32, the post-attention-normed row (the
  /// router's xn_out). Three launches in stream order after the routed down.
  void shared_expert_decode(const detail::LayerDev& L, const float* xn_row, float* out);
  /// The same for a prefill chunk's n rows (shared_expert.cu): pre.x += down(silu(gate xb) * up
  /// xb) over pre.xb (n, hidden) bf16, through cuBLAS and pre.gu / pre.act.
  void shared_expert_prefill(const detail::LayerDev& L, int n);

  const bf16* place(const std::vector<uint16_t>& host);
  /// As place, fp32 values (biases) into the same arena.
  const float* place_f32(const std::vector<float>& host);
  std::size_t resident_elems() const;
  void allocate_activations();
  /// One decode step, graph-capturable: every layer, final norm + lm_head into `logits`, and
  /// the greedy pick into d_pick. Reads the token, position and block table from d_token, d_pos
  /// and d_table.
  void step();
  /// Runs `token` at position `pos` through the step (the graph when opt.use_graphs, captured
  /// on first use); the table is uploaded (use_table). Copies nothing back, does not synchronise.
  void run_token(int32_t token, std::size_t pos);
  /// lm_head (with the final norm) on x, copied to the host and appended to `out`.
  void logits_row(const float* x_row, std::vector<float>& out);
  /// Runs tokens (> 1) at positions [pos0, pos0 + n) through the chunked prefill path (the
  /// table is uploaded); appends logits of every row when all_logits, else of the last row.
  void prefill(std::size_t pos0, std::span<const int32_t> tokens, bool all_logits, std::vector<float>& out);
  /// Sizes the prefill buffers for `chunk` tokens and sequences of `capacity` positions (a no-op
  /// when they are large enough).
  void ensure_prefill_buffers(int chunk, std::size_t capacity);

 private:
  /// Prefill attention through the flash kernel (opt.flash_attention and a supported shape) for
  /// chunks ending past opt.flash_attention_min_keys keys; otherwise through cuBLAS with a
  /// materialised score matrix (pre.scores).
  bool use_flash_attention() const;
  /// Key columns the cuBLAS path's score matrix needs for a cache of `capacity` rows.
  std::size_t score_columns(std::size_t capacity) const;
  void prefill_chunk(std::span<const int32_t> tokens, int pos0);
  /// Attention of chunk rows [r0, r1) (positions pos0 + r0 ...) against the context; the K/V
  /// rows of the whole chunk are already appended to the pool and the layer's rows gathered into
  /// pre.k_b / pre.v_b (flash) or pre.k32 / pre.v32.
  void prefill_attention(int r0, int r1, int pos0, bool flash);
  /// Rows [r0, r1) after attention: o-proj into the residual, post-attention RMSNorm, and for a
  /// MoE layer the router; its ids go to the host (pre.h_ids) and ids_ready[part] is recorded.
  void prefill_attention_out(int layer, int r0, int r1, int part);
  /// The MoE of a chunk whose rows were routed in `parts` parts (prefill_attention_out).
  void prefill_moe(int si, int n, int parts, int split_row, int layer);
  void gemm(const bf16* W, int out, int in, const bf16* X, int n, int ldx, float* Y, int ldy, float beta);
  /// gate|up → SwiGLU → down for a batch (prefill_experts.cu).
  void run_expert_batch(const detail::ExpertBatch& batch);
};

}  // namespace servedeck::worker::cuda
