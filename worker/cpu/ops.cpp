#include "worker/cpu/ops.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace servedeck::worker::cpu {

namespace {

inline float f16_to_f32(std::uint16_t h) {
  const std::uint32_t sign = (h & 0x8000u) << 16;
  std::uint32_t exp = (h >> 10) & 0x1f;
  std::uint32_t mant = h & 0x3ffu;
  std::uint32_t u;
  if (exp == 0) {
    if (mant == 0) {
      u = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do {
        ++e;
        mant <<= 1;
      } while ((mant & 0x400u) == 0);
      u = sign | (static_cast<std::uint32_t>(127 - 15 - e) << 23) | ((mant & 0x3ffu) << 13);
    }
  } else if (exp == 0x1f) {
    u = sign | 0x7f800000u | (mant << 13);
  } else {
    u = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

constexpr std::size_t k_min_parallel_work = 64 * 1024;

}  // namespace

void to_f32(const TensorRef& w, std::size_t offset, std::size_t count, float* out) {
  const std::byte* base = w.bytes.data();
  switch (w.info->dtype) {
    case Dtype::f32:
      std::memcpy(out, base + offset * 4, count * 4);
      break;
    case Dtype::bf16: {
      const std::byte* p = base + offset * 2;
      for (std::size_t i = 0; i < count; ++i) {
        std::uint16_t b;
        std::memcpy(&b, p + 2 * i, 2);
        out[i] = bf16_to_f32(b);
      }
      break;
    }
    case Dtype::f16: {
      const std::byte* p = base + offset * 2;
      for (std::size_t i = 0; i < count; ++i) {
        std::uint16_t b;
        std::memcpy(&b, p + 2 * i, 2);
        out[i] = f16_to_f32(b);
      }
      break;
    }
    case Dtype::f8_e4m3:
    case Dtype::u8:
      // Quantised weights are dequantised at load (worker/cpu/dequantized_weights.hpp); reaching
      // here means a stored FP8/NVFP4 tensor was read as plain numbers.
      throw std::logic_error("tensor '" + w.info->name + "' is stored as " + std::string(to_string(w.info->dtype)) +
                             " (quantised); it must be dequantised before it is read as plain numbers");
  }
}

void parallel_for(std::size_t n, std::size_t threads, std::size_t work,
                  const std::function<void(std::size_t, std::size_t)>& fn) {
  if (n == 0) return;
  // note: one thread per ~64K multiply-adds at most; starting a thread costs ~10-20 us, about
  // what one core needs for that much work.
  std::size_t t = std::max<std::size_t>(1, std::min({threads, n, work / k_min_parallel_work}));
  if (t == 1) {
    fn(0, n);
    return;
  }
  const std::size_t chunk = (n + t - 1) / t;
  std::vector<std::thread> pool;
  pool.reserve(t - 1);
  for (std::size_t i = 1; i < t; ++i) {
    const std::size_t b = i * chunk, e = std::min(n, b + chunk);
    if (b < e) pool.emplace_back(fn, b, e);
  }
  fn(0, std::min(n, chunk));
  for (auto& th : pool) th.join();
}

float dot(const float* a, const float* b, std::size_t n) {
  float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (std::size_t j = 0; j < 8; ++j) s[j] += a[i + j] * b[i + j];
  float tail = 0;
  for (; i < n; ++i) tail += a[i] * b[i];
  return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7])) + tail;
}

void matmul(const TensorRef& w, const float* x, std::size_t n, float* y, std::size_t threads) {
  const auto out_features = static_cast<std::size_t>(w.info->shape[0]);
  const auto in_features = static_cast<std::size_t>(w.info->shape[1]);
  parallel_for(out_features, threads, out_features * in_features * n, [&](std::size_t r0, std::size_t r1) {
    std::vector<float> row(in_features);
    for (std::size_t r = r0; r < r1; ++r) {
      to_f32(w, r * in_features, in_features, row.data());
      for (std::size_t t = 0; t < n; ++t) y[t * out_features + r] = dot(row.data(), x + t * in_features, in_features);
    }
  });
}

void rms_norm(const float* x, const float* weight, std::size_t rows, std::size_t dim, double eps, float* y) {
  for (std::size_t r = 0; r < rows; ++r) {
    const float* xr = x + r * dim;
    float* yr = y + r * dim;
    double ss = 0;
    for (std::size_t i = 0; i < dim; ++i) ss += static_cast<double>(xr[i]) * xr[i];
    const float inv = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(dim) + eps));
    for (std::size_t i = 0; i < dim; ++i) yr[i] = weight[i] * (xr[i] * inv);
  }
}

void rope(float* x, std::size_t heads, std::size_t head_dim, std::size_t rotary_dim, std::int64_t pos,
          const float* inv_freq, float scale) {
  const std::size_t half = rotary_dim / 2;
  std::vector<float> c(half), s(half);
  for (std::size_t i = 0; i < half; ++i) {
    const float angle = static_cast<float>(pos) * inv_freq[i];
    c[i] = std::cos(angle) * scale;
    s[i] = std::sin(angle) * scale;
  }
  for (std::size_t h = 0; h < heads; ++h) {
    float* v = x + h * head_dim;
    for (std::size_t i = 0; i < half; ++i) {
      const float a = v[i], b = v[i + half];
      v[i] = a * c[i] - b * s[i];
      v[i + half] = b * c[i] + a * s[i];
    }
  }
}

}  // namespace servedeck::worker::cpu
