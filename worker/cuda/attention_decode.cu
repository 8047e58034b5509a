// The decode step's attention over the paged KV pool (launch_attention_decode_paged, fused.cuh):
// flash-decoding (Dao et al., "Flash-Decoding for long-context inference", 2023): the context is
// split over blocks in proportion to its length, each block computes a partial softmax of its
// positions for the whole GQA group of its KV head on tensor cores, and the last block of a KV
// head combines the partials.
//
// Block (KV head h, split b), attention_block_config's warps (12 on a 227 KB-per-block device):
//   before the PDL wait: the position, the split's unit range, the pool block ids of each
//     warp's units 32 at a time in its lanes' registers (the next 32 read a window ahead; each
//     unit's id shuffled to the warp), and the norm weights and RoPE factors of the position;
//   after it: each warp's first two rows of the group's q|k|v loaded, then its first `stages`
//     units of 16 K and V rows into its shared-memory ring (cp.async, each lane the same 16-byte
//     chunks of every unit; rows of earlier steps and of the prefill, never written during this
//     step; the current position's row is zero-filled), which queue behind them (the head_dim
//     256 instance issues these copies before the wait and loads its rows inline); then q/k-norm + RoPE
//     of the group's query heads and of k (fp32), rounded to bf16: Q as an m16 tile (rows past
//     the group zero), k and v as the current position's row, which the block whose range holds
//     the position also writes into the pool;
//   per unit (each warp its own: units w, w + warps, ... of the range): the current row patched
//     in where it falls, S = Q·Kᵀ (2 n8 tiles × head_dim / 16 k steps of mma.m16n8k16), the
//     online softmax step of flash_mma.cuh (log2 domain, keys past the position masked in the
//     position's own unit, P rounded to bf16), O rescaled unless every factor is exactly 1,
//     O += P·V, then the ring slot is refilled with the unit `stages` ahead;
//   the (m, l, O) of the group's rows of the warps with units, through shared memory, merged in
//   warp order into the block's partial (scratch): the rows' weights first (one thread a row),
//   then a float4 per thread; then arrive_last (H1): the last of the KV head's blocks merges the
//   splits the same way (one warp a row for the weights, normalised by the row's sum, which is a
//   warp tree over the splits; then a float4 per thread, summed in split order), writes the
//   group's outputs, resets the counter and publishes the group's heads (H2).
// Numerics: those of the flash prefill kernels (flash_attention.cuh: bf16 Q, K, V and P, fp32
// accumulation and running max / sum), with every sum in a fixed order.
#include <algorithm>
#include <cmath>
#include <iterator>
#include <string>

#include "worker/cuda/dot.cuh"
#include "worker/cuda/flash_mma.cuh"
#include "worker/cuda/fused.cuh"
#include "worker/cuda/fused_launch.cuh"
#include "worker/cuda/handshakes.cuh"
#include "worker/cuda/launch_check.cuh"

namespace servedeck::worker::cuda {

namespace {

using bf16 = __nv_bfloat16;
using flash::cp_async16;
using flash::cp_async16_evict_first;
using flash::cp_async_commit;
using flash::ldmatrix_x4;
using flash::ldmatrix_x4_trans;
using flash::mma;

/// Warps per block at most: 12 (384 threads, at most 170 registers each) up to head_dim 128, 8
/// above it (the head_dim 256 instance needs more registers).
template <int HDMAX>
constexpr int max_warps() { return HDMAX <= 128 ? 12 : 8; }
constexpr int k_unit = 16;  // positions per warp step: the n of two m16n8k16 tiles, the k of one
constexpr int k_max_stages = 2;  // ring stages per warp (cp_async_wait_dynamic waits for 0 or 1 pending)

/// (warps per block, ring stages per warp) in order of preference (attention_block_config;
/// docs/performance.md, 2026-12-02 "decode attention block").
constexpr AttentionBlockConfig k_configs[] = {{12, 2}, {8, 2}, {12, 1}, {8, 1}, {4, 2}, {4, 1}};

/// The split's share of the context: `units` 16-position units, `active` splits of `per` units
/// (the last may be shorter); splits >= active have none. The same on host and device.
struct SplitPlan {
  int units, active, per;
};

__host__ __device__ inline SplitPlan split_plan(int len, int splits) {
  SplitPlan p;
  p.units = (len + k_unit - 1) / k_unit;
  int a = (p.units + k_attention_min_split_units - 1) / k_attention_min_split_units;
  a = a < splits ? a : splits;
  p.per = (p.units + a - 1) / a;
  p.active = (p.units + p.per - 1) / p.per;
  return p;
}

/// Shared-memory layout of a block, in bytes from the start (all offsets multiples of 16).
struct SmemLayout {
  int ld;  // bf16 row stride of Q and the K/V tiles: head_dim + 8 (an odd number of 16-byte lines: ldmatrix without bank conflicts)
  int ostr, wstride;  // the warp merge's floats per O row (head_dim + 8: conflict-free 8-byte stores) and per warp
  std::size_t q, kv_row, qf, ring, tile, weights, total;  // weights: from the ring, the warp merge's weights
  __host__ __device__ SmemLayout(int hd, int group, int warps, int stages) {
    ld = hd + 8;
    tile = static_cast<std::size_t>(k_unit) * ld * 2;                              // 16 rows of K (or V)
    q = 0;                                                                         // Q: 16 rows
    kv_row = q + tile;                                                             // this position's k, v (bf16)
    qf = kv_row + static_cast<std::size_t>(4) * hd;                                // fp32 q heads, k, v
    ring = qf + static_cast<std::size_t>(group + 2) * hd * 4;
    const std::size_t ring_bytes = static_cast<std::size_t>(warps) * stages * 2 * tile;
    // Each warp's O (group rows), m (16), l (16); then the rows' weights of the warps.
    ostr = hd + 8;
    wstride = group * ostr + 32;
    weights = static_cast<std::size_t>(warps) * wstride * 4;
    const std::size_t warp_merge = weights + static_cast<std::size_t>(group) * warps * 4;
    const std::size_t split_merge = static_cast<std::size_t>(group) * k_attention_max_splits * 4;  // the splits' weights
    std::size_t r = ring_bytes > warp_merge ? ring_bytes : warp_merge;
    r = r > split_merge ? r : split_merge;
    total = ring + r;
  }
};

__device__ __forceinline__ void cp_async_wait_dynamic(int pending) {
  // cp.async.wait_group takes an immediate.
  if (pending <= 0) flash::cp_async_wait<0>();
  else flash::cp_async_wait<1>();
}

template <int HDMAX>
__global__ void __launch_bounds__(max_warps<HDMAX>() * 32) attention_decode_paged_kernel(const float* __restrict__ qkv, const bf16* __restrict__ qn,
                                                                               const bf16* __restrict__ kn, PagedKv kv, float* __restrict__ out,
                                                                               AttentionShape s, const int32_t* pos_p,
                                                                               unsigned int* heads_done, int stages) {
  SERVEDECK_TRACE_BLOCK();
  // The o-proj may launch at once (handshakes.cuh, launch order): its blocks stage their rows on
  // SMs with room beside this kernel's blocks (none beside a 12-warp, 2-stage block of ~220 KB:
  // they start as these finish).
  detail::trigger_dependents();
  constexpr int NF = HDMAX / 8;  // accumulator column groups of 8
  extern __shared__ float4 dyn4[];
  __shared__ int is_last;
  char* smem = reinterpret_cast<char*>(dyn4);
  const int hd = s.head_dim, G = s.n_heads / s.n_kv_heads;
  const int kvh = blockIdx.x / s.splits, split = blockIdx.x % s.splits;
  const int kv_dim = s.n_kv_heads * hd, q_dim = s.n_heads * hd;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, t4 = lane % 4, warps = blockDim.x / 32;
  const SmemLayout L(hd, G, warps, stages);
  const int ld = L.ld;
  bf16* Qs = reinterpret_cast<bf16*>(smem + L.q);
  bf16* kb = reinterpret_cast<bf16*>(smem + L.kv_row);
  bf16* vb = kb + hd;
  float* qf = reinterpret_cast<float*>(smem + L.qf);
  bf16* ring = reinterpret_cast<bf16*>(smem + L.ring);

  // Before the wait: the position (written by the host before the step), the block table, the
  // norm weights and frequencies (never written). The first units' K/V rows (earlier steps') are
  // issued after the wait, behind q|k|v's loads (see k_q_first). qkv is read through the
  // read-only path (const __restrict__): correct only because nothing reads it before the wait.
  const int pos = *pos_p;
  const SplitPlan P = split_plan(pos + 1, s.splits);
  const bool active = split < P.active;
  const int u_begin = split * P.per, u_end = active ? min(P.units, u_begin + P.per) : u_begin;
  const int first = u_begin + warp;
  const int n_mine = first < u_end ? (u_end - first + warps - 1) / warps : 0;
  bf16* mine = ring + static_cast<size_t>(warp) * stages * 2 * k_unit * ld;
  const int B = kv.block_tokens, chunks = hd / 8;  // 16-byte chunks per row
  // The pool blocks of the warp's units, 32 at a time: lane l holds the block of unit 32 w + l of
  // window w (tab), and the next window's (tab_next, loaded a window ahead), so no unit's loads
  // wait on a table read.
  auto table_of = [&](int i) { return i < n_mine ? __ldg(kv.table + (first + i * warps) * k_unit / B) : 0; };
  int tab = table_of(lane), tab_next = table_of(32 + lane);
  // This lane's 16-byte chunks of a unit's 16 K (and V) rows, the same for every unit: chunk
  // lane + 32 j is row lrow[j], columns lcol[j] .. + 7 (the division once, not per unit).
  constexpr int k_slots = k_unit * (HDMAX / 8) / 32;
  const int unit_chunks = k_unit * chunks;
  int lrow[k_slots], lcol[k_slots];
#pragma unroll
  for (int j = 0; j < k_slots; ++j) {
    const int c = lane + 32 * j;
    lrow[j] = c / chunks;
    lcol[j] = (c % chunks) * 8;
  }
  uint64_t policy;  // every K/V copy evict-first (performance.md, 2026-12-02 "decode attention L2 policy")
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  auto load = [&](int i) {
    if (i < n_mine) {  // warp-uniform
      if (i % 32 == 0 && i > 0) {
        tab = tab_next;
        tab_next = table_of(i + 32 + lane);
      }
      const int p0 = (first + i * warps) * k_unit;
      const size_t base = static_cast<size_t>(__shfl_sync(0xffffffffu, tab, i % 32)) * B + p0 % B;
      const size_t head0 = base * kv_dim + static_cast<size_t>(kvh) * hd;
      const bf16* ks = kv.k + head0;
      const bf16* vs = kv.v + head0;
      bf16* Kt = mine + static_cast<size_t>(i % stages) * 2 * k_unit * ld;
      bf16* Vt = Kt + k_unit * ld;
#pragma unroll
      for (int j = 0; j < k_slots; ++j) {
        if (lane + 32 * j < unit_chunks) {
          const int r = lrow[j], col = lcol[j];
          const bool valid = p0 + r < pos;  // the current position and those after it: zeros
          cp_async16_evict_first(Kt + r * ld + col, ks + r * kv_dim + col, valid, policy);
          cp_async16_evict_first(Vt + r * ld + col, vs + r * kv_dim + col, valid, policy);
        }
      }
    }
    cp_async_commit();  // one group per call, empty or not, so the wait below counts units
  };
  // Up to head_dim 128 each warp loads its first two rows of q|k|v right after the wait, ahead of
  // its first units' copies, so that their loads lead the SM's memory queue instead of waiting
  // behind ~200 KB of K/V (docs/performance.md, 2026-12-03 "decode attention prologue"). The 256
  // instance issues the copies before the wait: after it, it spills registers on sm_120.
  constexpr bool k_q_first = HDMAX <= 128;
  if constexpr (!k_q_first)
    for (int i = 0; i < stages; ++i) load(i);
  const detail::RopeHeadPrefetch rq = detail::prefetch_rope_head(qn, s.inv_freq, hd, s.rotary_dim, pos, lane);
  const detail::RopeHeadPrefetch rk = detail::prefetch_rope_head(kn, s.inv_freq, hd, s.rotary_dim, pos, lane);
  detail::wait_for_predecessor();
  // Row j of the group's G + 2 (its q heads, then k and v of the position) in q|k|v.
  auto head_src = [&](int j) {
    return qkv + (j < G ? static_cast<size_t>(kvh * G + j) * hd : j == G ? q_dim + static_cast<size_t>(kvh) * hd : q_dim + kv_dim + static_cast<size_t>(kvh) * hd);
  };
  detail::HeadValues h0{}, h1{};
  if constexpr (k_q_first) {
    if (active && warp < G + 2) h0 = detail::load_head(head_src(warp), hd, lane);
    if (active && warp + warps < G + 2) h1 = detail::load_head(head_src(warp + warps), hd, lane);
    for (int i = 0; i < stages; ++i) load(i);
  }
  const int stride = hd + 4;  // floats per (split, row) partial: M, L, 2 unused, O (16-byte aligned)
  float* head_part = s.scratch + static_cast<size_t>(kvh) * s.splits * G * stride;
  float* wpart = reinterpret_cast<float*>(ring);
  if (active) {  // block-uniform: splits past the context only arrive
  // q heads of the group, k and v of the position: fp32, then bf16.
  auto prepare = [&](int j, const detail::HeadValues& h) {  // row j of the group, normed and rotated, into qf
    float* dst = qf + static_cast<size_t>(j) * hd;
    if (j < G) {
      detail::norm_rope_head_loaded(h, rq, qn != nullptr, dst, hd, s.rotary_dim, s.eps, lane);
    } else if (j == G) {
      detail::norm_rope_head_loaded(h, rk, kn != nullptr, dst, hd, s.rotary_dim, s.eps, lane);
    } else {
#pragma unroll
      for (int i = 0; i < 8; ++i)
        if (lane + 32 * i < hd) dst[lane + 32 * i] = h.v[i];
    }
  };
  int j = warp;
  if constexpr (k_q_first) {
    if (j < G + 2) prepare(j, h0);
    j += warps;
    if (j < G + 2) prepare(j, h1);
    j += warps;
  }
  for (; j < G + 2; j += warps) prepare(j, detail::load_head(head_src(j), hd, lane));
  __syncthreads();
  for (int i = threadIdx.x; i < k_unit * hd; i += blockDim.x) {
    const int r = i / hd, c = i % hd;
    Qs[r * ld + c] = __float2bfloat16_rn(r < G ? qf[static_cast<size_t>(r) * hd + c] : 0.f);
  }
  for (int i = threadIdx.x; i < hd; i += blockDim.x) {
    kb[i] = __float2bfloat16_rn(qf[static_cast<size_t>(G) * hd + i]);
    vb[i] = __float2bfloat16_rn(qf[static_cast<size_t>(G + 1) * hd + i]);
  }
  __syncthreads();
  SERVEDECK_TRACE_STAGED();  // trace builds: q, k and v ready (the end of the post-wait prologue)
  const int pos_unit = pos / k_unit;
  if (pos_unit >= u_begin && pos_unit < u_end) {  // this block's range holds the position: append it
    const size_t row = static_cast<size_t>(kv.table[pos / B]) * B + pos % B;
    for (int i = threadIdx.x; i < hd; i += blockDim.x) {
      kv.k[row * kv_dim + static_cast<size_t>(kvh) * hd + i] = kb[i];
      kv.v[row * kv_dim + static_cast<size_t>(kvh) * hd + i] = vb[i];
    }
  }

  float o[NF][4];
#pragma unroll
  for (int f = 0; f < NF; ++f) o[f][0] = o[f][1] = o[f][2] = o[f][3] = 0.f;
  flash::SoftmaxRows rows;
  rows.qpos0 = rows.qpos1 = pos;
  const float scale_log2 = rsqrtf(static_cast<float>(hd)) * 1.4426950408889634f;
  const int qrow = lane % 16, qcol = (lane / 16) * 8;                       // A: ldmatrix rows / column half
  const int krow = (lane / 16) * 8 + lane % 8, kcol = ((lane / 8) % 2) * 8;  // B = Kᵀ: keys, dimension half
  const int vrow = ((lane / 8) % 2) * 8 + lane % 8, vcol = (lane / 16) * 8;  // B = V (transposed load)
  for (int i = 0; i < n_mine; ++i) {
    cp_async_wait_dynamic(stages - 1);
    __syncwarp();
    bf16* Kt = mine + static_cast<size_t>(i % stages) * 2 * k_unit * ld;
    bf16* Vt = Kt + k_unit * ld;
    const int u = first + i * warps;
    if (u == pos_unit) {
      const int r = pos % k_unit;
      for (int c = lane; c < hd; c += 32) {
        Kt[r * ld + c] = kb[c];
        Vt[r * ld + c] = vb[c];
      }
      __syncwarp();
    }
    float sc[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
#pragma unroll
    for (int kk = 0; kk < HDMAX / 16; ++kk) {
      if (kk * 16 < hd) {
        uint32_t a[4], b[4];
        ldmatrix_x4(a, Qs + qrow * ld + kk * 16 + qcol);
        ldmatrix_x4(b, Kt + krow * ld + kk * 16 + kcol);
        mma(sc[0], a, b[0], b[1]);
        mma(sc[1], a, b[2], b[3]);
      }
    }
    uint32_t p[1][4];
    float c0, c1;
    // Keys past the position are only in the position's own unit.
    if (u == pos_unit) rows.tile<2>(sc, u * k_unit, true, t4, scale_log2, p, c0, c1);
    else rows.tile<2>(sc, u * k_unit, false, t4, scale_log2, p, c0, c1);
    // Once the running maxima settle, most units leave them as they are (factors exactly 1).
    if (!__all_sync(0xffffffffu, c0 == 1.f && c1 == 1.f)) flash::rescale_rows<NF>(o, c0, c1);
#pragma unroll
    for (int f = 0; f < NF; f += 2) {
      if (f * 8 < hd) {
        uint32_t b[4];
        ldmatrix_x4_trans(b, Vt + vrow * ld + f * 8 + vcol);
        mma(o[f], p[0], b[0], b[1]);
        mma(o[f + 1], p[0], b[2], b[3]);
      }
    }
    __syncwarp();  // every lane is done with the slot before it is refilled
    load(i + stages);
  }
  flash::cp_async_wait<0>();
  __syncthreads();  // the ring is free: it holds the warps' partials from here on
  SERVEDECK_TRACE_SUMMED();  // trace builds: every warp's units done

  // Each warp with units writes its (m, l, O) of the group's rows (this lane's rows g and g + 8
  // where they are < G; two adjacent columns as one 8-byte store, rows ostr floats apart: no bank
  // conflicts). Then one thread per row computes the warps' weights 2^(m_w − M) (M: the row's
  // maximum over the warps; 0 where l_w is 0) and the row's (M, L); then each float4 of the
  // block's partial is the weighted sum over the warps in warp order.
  const int used = min(warps, u_end - u_begin);  // warp w has units iff w < u_end - u_begin
  const int ostr = L.ostr, wstride = L.wstride;  // floats per row of a warp's O; per warp: O, m (16), l (16)
  const int ml0 = G * ostr;                      // a warp's m, then l, from here
  const int q4 = hd / 4;
  float* part = head_part + static_cast<size_t>(split) * G * stride;
  if (warp < used) {
    float* w = wpart + static_cast<size_t>(warp) * wstride;
    const int g = lane / 4;
#pragma unroll
    for (int f = 0; f < NF; ++f) {
      if (f * 8 < hd) {
        const int col = f * 8 + 2 * t4;
        if (g < G) *reinterpret_cast<float2*>(w + g * ostr + col) = make_float2(o[f][0], o[f][1]);
        if (g + 8 < G) *reinterpret_cast<float2*>(w + (g + 8) * ostr + col) = make_float2(o[f][2], o[f][3]);
      }
    }
    if (t4 == 0) {
      if (g < G) {
        w[ml0 + g] = rows.m0;
        w[ml0 + 16 + g] = rows.l0;
      }
      if (g + 8 < G) {
        w[ml0 + g + 8] = rows.m1;
        w[ml0 + 16 + g + 8] = rows.l1;
      }
    }
  }
  __syncthreads();
  float* wts = reinterpret_cast<float*>(smem + L.ring + L.weights);  // (G, warps)
  if (threadIdx.x < G) {
    const int r = threadIdx.x;
    float M = -INFINITY, l = 0.f;
    for (int v = 0; v < used; ++v) M = fmaxf(M, wpart[static_cast<size_t>(v) * wstride + ml0 + r]);
    for (int v = 0; v < used; ++v) {
      const float* ww = wpart + static_cast<size_t>(v) * wstride;
      const float wt = ww[ml0 + 16 + r] > 0.f ? exp2f(ww[ml0 + r] - M) : 0.f;
      wts[r * warps + v] = wt;
      l += ww[ml0 + 16 + r] * wt;
    }
    part[static_cast<size_t>(r) * stride] = M;
    part[static_cast<size_t>(r) * stride + 1] = l;
  }
  __syncthreads();
  for (int i = threadIdx.x; i < G * q4; i += blockDim.x) {
    const int r = i / q4, c = (i % q4) * 4;
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int v = 0; v < used; ++v) {
      const float wt = wts[r * warps + v];
      const float4 x = *reinterpret_cast<const float4*>(wpart + static_cast<size_t>(v) * wstride + r * ostr + c);
      acc.x += x.x * wt;
      acc.y += x.y * wt;
      acc.z += x.z * wt;
      acc.w += x.w * wt;
    }
    *reinterpret_cast<float4*>(part + static_cast<size_t>(r) * stride + 4 + c) = acc;
  }
  }  // active
  if (!detail::arrive_last(s.counters, kvh, static_cast<unsigned>(s.splits), is_last)) return;

  // The last block of the KV head merges the active splits' partials (read through L2) the same
  // way: one warp per row loads the splits' (M, L) (lanes b and b + 32: at most 64 splits), takes
  // the maximum over those with L > 0 and stores each split's weight 2^(M_b − M) / L_row in
  // shared memory (the ring is free); then each thread sums one row's four columns over the
  // splits in split order. The code is short on purpose: it runs once per KV head per step, from
  // a cold instruction cache.
  static_assert(k_attention_max_splits <= 64, "the split merge holds two splits per lane");
  const int A = P.active, q4 = hd / 4;
  float* sw = wpart;  // (G, A) normalised weights
  for (int r = warp; r < G; r += warps) {
    float2 ml[2];
    float M = -INFINITY;
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int b = lane + 32 * j;
      ml[j] = b < A ? __ldcg(reinterpret_cast<const float2*>(head_part + static_cast<size_t>(b * G + r) * stride)) : make_float2(0.f, 0.f);
      if (ml[j].y > 0.f) M = fmaxf(M, ml[j].x);
    }
    M = detail::warp_max(M);
    float wt[2], l = 0.f;
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      wt[j] = ml[j].y > 0.f ? exp2f(ml[j].x - M) : 0.f;
      l += ml[j].y * wt[j];
    }
    const float il = 1.f / detail::warp_sum(l);
#pragma unroll
    for (int j = 0; j < 2; ++j)
      if (lane + 32 * j < A) sw[r * A + lane + 32 * j] = wt[j] * il;
  }
  __syncthreads();
  for (int i = threadIdx.x; i < G * q4; i += blockDim.x) {
    const int r = i / q4, c = (i % q4) * 4;
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll 8
    for (int b = 0; b < A; ++b) {
      const float wt = sw[r * A + b];
      const float4 x = __ldcg(reinterpret_cast<const float4*>(head_part + static_cast<size_t>(b * G + r) * stride + 4 + c));
      acc.x += x.x * wt;
      acc.y += x.y * wt;
      acc.z += x.z * wt;
      acc.w += x.w * wt;
    }
    *reinterpret_cast<float4*>(out + static_cast<size_t>(kvh * G + r) * hd + c) = acc;
  }
  if (threadIdx.x == 0) s.counters[kvh] = 0u;  // H1's reset, by the block that completed the count
  if (heads_done != nullptr) {  // H2 (handshakes.cuh): the group's outputs are written
    __syncthreads();
    if (threadIdx.x == 0) detail::publish_count(heads_done, static_cast<unsigned>(G));
  }
}

template <int HDMAX>
AttentionBlockConfig block_config_for(const AttentionShape& s) {
  const auto kernel = attention_decode_paged_kernel<HDMAX>;
  const int G = s.n_heads / s.n_kv_heads;
  for (const AttentionBlockConfig& k : k_configs)
    if (k.warps <= max_warps<HDMAX>() && detail::fits_smem(kernel, SmemLayout(s.head_dim, G, k.warps, k.stages).total)) return k;
  return k_configs[std::size(k_configs) - 1];
}

template <int HDMAX>
void launch_for(const float* qkv, const bf16* q_norm, const bf16* k_norm, const PagedKv& kv, float* out, const AttentionShape& s,
                const int32_t* pos, cudaStream_t stream, bool pdl, unsigned int* heads_done) {
  const auto kernel = attention_decode_paged_kernel<HDMAX>;
  static const bool prepared = [&] {
    // The attribute belongs to the function: the largest layout of this instance (group 16, the
    // most warps and stages), capped by the device (allow_dynamic_smem).
    detail::allow_dynamic_smem(kernel, SmemLayout(HDMAX, 16, max_warps<HDMAX>(), k_max_stages).total);
    detail::prefer_max_shared(kernel);
    return true;
  }();
  (void)prepared;
  const AttentionBlockConfig c = block_config_for<HDMAX>(s);
  const SmemLayout L(s.head_dim, s.n_heads / s.n_kv_heads, c.warps, c.stages);
  detail::require(detail::fits_smem(kernel, L.total), "launch_attention_decode_paged",
                  "head_dim " + std::to_string(s.head_dim) + " needs " + std::to_string(L.total) +
                      " bytes of shared memory per block, more than the device allows");
  detail::launch(kernel, s.n_kv_heads * s.splits, c.warps * 32, L.total, stream, pdl, qkv, q_norm, k_norm, kv, out, s, pos, heads_done,
                 c.stages);
}

}  // namespace

AttentionBlockConfig attention_block_config(const AttentionShape& s) {
  if (s.head_dim <= 32) return block_config_for<32>(s);
  if (s.head_dim <= 64) return block_config_for<64>(s);
  if (s.head_dim <= 128) return block_config_for<128>(s);
  return block_config_for<256>(s);
}

int attention_splits(int n_kv_heads) {
  const int kv = n_kv_heads > 0 ? n_kv_heads : 1;
  return std::clamp((detail::sm_count() + kv - 1) / kv, 1, k_attention_max_splits);
}

void launch_attention_decode_paged(const float* qkv, const bf16* q_norm, const bf16* k_norm, const PagedKv& kv, float* out,
                                   const AttentionShape& s, const int32_t* pos, cudaStream_t stream, bool pdl, unsigned int* heads_done) {
  using detail::require;
  const char* what = "launch_attention_decode_paged";
  require(s.head_dim >= 16 && s.head_dim <= 256 && s.head_dim % 16 == 0, what,
          "head_dim must be a multiple of 16 in [16, 256], got " + std::to_string(s.head_dim));
  require(s.n_kv_heads > 0 && s.n_heads % s.n_kv_heads == 0 && s.n_heads / s.n_kv_heads <= 16, what,
          "n_heads (" + std::to_string(s.n_heads) + ") must be a multiple of n_kv_heads (" + std::to_string(s.n_kv_heads) +
              ") by at most 16");
  require(s.rotary_dim >= 0 && s.rotary_dim <= s.head_dim && s.rotary_dim % 2 == 0, what,
          "rotary_dim must be even and in [0, head_dim], got " + std::to_string(s.rotary_dim));
  require((q_norm == nullptr) == (k_norm == nullptr), what, "q_norm and k_norm must both be set or both null");
  require(s.scratch != nullptr && s.counters != nullptr, what, "scratch and counters must be set");
  require(s.splits >= 1 && s.splits <= k_attention_max_splits, what,
          "splits must be in [1, " + std::to_string(k_attention_max_splits) + "], got " + std::to_string(s.splits));
  require(kv.k != nullptr && kv.v != nullptr && kv.table != nullptr && detail::aligned16(kv.k) && detail::aligned16(kv.v), what,
          "the pool's K and V must be set and 16-byte aligned, and the block table set");
  require(kv.block_tokens > 0 && kv.block_tokens % k_unit == 0, what,
          "block_tokens must be a positive multiple of 16, got " + std::to_string(kv.block_tokens));
  require(detail::aligned16(s.scratch) && detail::aligned16(out), what, "scratch and out must be 16-byte aligned");
  if (s.head_dim <= 32) return launch_for<32>(qkv, q_norm, k_norm, kv, out, s, pos, stream, pdl, heads_done);
  if (s.head_dim <= 64) return launch_for<64>(qkv, q_norm, k_norm, kv, out, s, pos, stream, pdl, heads_done);
  if (s.head_dim <= 128) return launch_for<128>(qkv, q_norm, k_norm, kv, out, s, pos, stream, pdl, heads_done);
  launch_for<256>(qkv, q_norm, k_norm, kv, out, s, pos, stream, pdl, heads_done);
}

}  // namespace servedeck::worker::cuda

SERVEDECK_TRACE_TU_SETTER(set_decode_trace_buffer_attention_decode)
