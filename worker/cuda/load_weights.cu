// Weight conversion for the CUDA backend's loader (cuda_backend_load.cu): checkpoint tensors to
// bf16 or fp32, quantised expert blocks as stored or quantised in memory, seeded synthetic
// weights, and YaRN's attention factor folded into the weights (load_weights.cuh).
#include "worker/cuda/load_weights.cuh"

#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>

#include "worker/model/quantize.hpp"

namespace servedeck::worker::cuda::detail {

uint16_t f32_to_bf16_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);                      // round to nearest even
  return static_cast<uint16_t>(u >> 16);
}

float bf16_bits_to_f32(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
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

/// Converts a checkpoint tensor to bf16 into `dst` (element count must match); a quantised
/// weight is dequantised (fp32, then rounded to bf16).
void to_bf16(const WeightRef& t, uint16_t* dst, std::size_t count) {
  if (!t.info) throw std::runtime_error("cuda backend: missing tensor");
  if (t.quant) {
    const QuantizedWeight& q = *t.quant;
    if (static_cast<std::size_t>(q.rows * q.cols) != count)
      throw std::runtime_error("cuda backend: weight '" + q.module + "' has " + std::to_string(q.rows * q.cols) +
                               " elements, expected " + std::to_string(count));
    std::vector<float> row(static_cast<std::size_t>(q.cols));
    for (int64_t r = 0; r < q.rows; ++r) {
      dequantize_rows(q, r, 1, row.data());
      for (int64_t c = 0; c < q.cols; ++c) dst[r * q.cols + c] = f32_to_bf16_bits(row[static_cast<std::size_t>(c)]);
    }
    return;
  }
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
    case Dtype::f8_e4m3:
    case Dtype::u8:
      throw std::logic_error("cuda backend: tensor '" + t.info->name + "' is quantised but has no quantisation description");
  }
}

/// Converts an unquantised checkpoint tensor (BF16/F16/F32) to fp32 into `dst` (element count
/// must match): the biases, kept in fp32 as the CPU backend widens them.
void to_f32(const WeightRef& t, float* dst, std::size_t count) {
  if (!t.info) throw std::runtime_error("cuda backend: missing tensor");
  if (t.info->element_count() != count)
    throw std::runtime_error("cuda backend: tensor '" + t.info->name + "' has " + std::to_string(t.info->element_count()) +
                             " elements, expected " + std::to_string(count));
  const std::byte* src = t.bytes.data();
  for (std::size_t i = 0; i < count; ++i) {
    uint16_t h;
    switch (t.info->dtype) {
      case Dtype::bf16:
        std::memcpy(&h, src + 2 * i, 2);
        dst[i] = bf16_bits_to_f32(h);
        break;
      case Dtype::f16:
        std::memcpy(&h, src + 2 * i, 2);
        dst[i] = f16_bits_to_f32(h);
        break;
      case Dtype::f32: std::memcpy(dst + i, src + 4 * i, 4); break;
      case Dtype::f8_e4m3:
      case Dtype::u8:
        throw std::runtime_error("cuda backend: tensor '" + t.info->name + "' is quantised; a bias must be BF16, F16 or F32");
    }
  }
}

/// Writes matrix m (0 gate, 1 up, 2 down) of a quantised expert block from the checkpoint's
/// stored tensors (layout: quant_layout.cuh). Preconditions: w.quant has the layout's format.
void write_quantised(const QuantLayout& L, int m, const QuantizedWeight& q, std::byte* block) {
  const std::size_t w_at = m == 0 ? L.gate_w() : m == 1 ? L.up_w() : L.down_w();
  const std::size_t s_at = m == 0 ? L.gate_s() : m == 1 ? L.up_s() : L.down_s();
  std::memcpy(block + w_at, q.weight.bytes.data(), q.weight.bytes.size());
  if (L.format == ExpertFormat::nvfp4) {
    std::memcpy(block + s_at, q.scale.bytes.data(), q.scale.bytes.size());
    std::memcpy(block + L.globals() + 4 * static_cast<std::size_t>(m), &q.global_scale, 4);
    return;
  }
  const std::size_t n = q.scale.info->element_count();
  for (std::size_t i = 0; i < n; ++i) {  // scale_inv as f32 (a BF16 one widened)
    float f;
    if (q.scale.info->dtype == Dtype::f32) {
      std::memcpy(&f, q.scale.bytes.data() + 4 * i, 4);
    } else {
      uint16_t b;
      std::memcpy(&b, q.scale.bytes.data() + 2 * i, 2);
      const uint32_t u = static_cast<uint32_t>(b) << 16;
      std::memcpy(&f, &u, 4);
    }
    std::memcpy(block + s_at + 4 * i, &f, 4);
  }
}

/// Quantises fp32 matrix m (rows x cols) of an expert into block (layout L), as the published
/// quantisers do (worker/model/quantize.hpp): the benchmark's synthesised experts.
void quantise_into(const QuantLayout& L, int m, const float* w, int rows, int cols, std::byte* block) {
  const std::size_t w_at = m == 0 ? L.gate_w() : m == 1 ? L.up_w() : L.down_w();
  const std::size_t s_at = m == 0 ? L.gate_s() : m == 1 ? L.up_s() : L.down_s();
  if (L.format == ExpertFormat::fp8_block) {
    const auto q = quantize_fp8_block(w, rows, cols, L.br, L.bc);
    std::memcpy(block + w_at, q.weight.data(), q.weight.size());
    std::memcpy(block + s_at, q.scale_inv.data(), q.scale_inv.size() * 4);
  } else {
    const auto q = quantize_nvfp4(w, rows, cols);
    std::memcpy(block + w_at, q.weight.data(), q.weight.size());
    std::memcpy(block + s_at, q.scale.data(), q.scale.size());
    std::memcpy(block + L.globals() + 4 * static_cast<std::size_t>(m), &q.global_scale, 4);
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

// See load_weights.cuh.
void fold_yarn_scale(float m, int head_dim, int rotary, int q_dim, int kv_dim, std::size_t hidden, uint16_t* qkv,
                     std::vector<float>* qkv_bias, uint16_t* q_norm, uint16_t* k_norm) {
  auto scaled = [m](uint16_t b) { return f32_to_bf16_bits(bf16_bits_to_f32(b) * m); };
  if (q_norm != nullptr) {
    for (int i = 0; i < rotary; ++i) {
      q_norm[i] = scaled(q_norm[i]);
      k_norm[i] = scaled(k_norm[i]);
    }
    return;
  }
  for (int row = 0; row < q_dim + kv_dim; ++row) {
    if (row % head_dim >= rotary) continue;
    uint16_t* w = qkv + static_cast<std::size_t>(row) * hidden;
    for (std::size_t c = 0; c < hidden; ++c) w[c] = scaled(w[c]);
    if (qkv_bias != nullptr) (*qkv_bias)[static_cast<std::size_t>(row)] *= m;
  }
}

}  // namespace servedeck::worker::cuda::detail
