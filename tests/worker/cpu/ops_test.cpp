// CPU ops: dtype widening (BF16/F16/F32, including F16 subnormals and infinities), matmul against
// a naive loop for every dtype and thread count, RoPE against the rotate_half formula computed
// in double, RMSNorm, parallel_for coverage.
#include <doctest/doctest.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "worker/cpu/ops.hpp"
#include "worker/model/rope.hpp"
#include "worker/model/safetensors_writer.hpp"

using namespace servedeck::worker;

namespace {

/// A TensorRef over caller-owned bytes.
struct OwnedTensor {
  TensorInfo info;
  std::vector<std::byte> bytes;
  TensorRef ref() const { return {&info, bytes, nullptr}; }
};

OwnedTensor make(Dtype dt, std::vector<std::int64_t> shape, const std::vector<float>& values) {
  OwnedTensor t;
  t.info.name = "t";
  t.info.dtype = dt;
  t.info.shape = std::move(shape);
  t.bytes.resize(values.size() * dtype_size(dt));
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (dt == Dtype::f32) {
      std::memcpy(t.bytes.data() + 4 * i, &values[i], 4);
    } else if (dt == Dtype::bf16) {
      const std::uint16_t b = float_to_bf16(values[i]);
      std::memcpy(t.bytes.data() + 2 * i, &b, 2);
    }
  }
  t.info.end = t.bytes.size();
  return t;
}

}  // namespace

TEST_CASE("to_f32 widens F16 bit patterns exactly, including subnormals and infinities") {
  const std::vector<std::uint16_t> bits{0x3c00, 0xc000, 0x0001, 0x0400, 0x7bff, 0x7c00, 0xfc00, 0x8000, 0x3555};
  const std::vector<float> want{1.0f, -2.0f, 5.9604645e-8f, 6.1035156e-5f, 65504.0f,
                                std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                                -0.0f, 0.33325195f};
  OwnedTensor t;
  t.info.dtype = Dtype::f16;
  t.info.shape = {static_cast<std::int64_t>(bits.size())};
  t.bytes.resize(bits.size() * 2);
  std::memcpy(t.bytes.data(), bits.data(), t.bytes.size());
  std::vector<float> got(bits.size());
  cpu::to_f32(t.ref(), 0, bits.size(), got.data());
  for (std::size_t i = 0; i < bits.size(); ++i) {
    INFO("f16 bits 0x" << std::hex << bits[i]);
    CHECK(got[i] == want[i]);
  }
  CHECK(std::signbit(got[7]));
  // An offset reads from the middle.
  cpu::to_f32(t.ref(), 4, 1, got.data());
  CHECK(got[0] == 65504.0f);
}

TEST_CASE("matmul equals a naive loop for BF16 and F32 weights and any thread count") {
  const std::size_t out = 37, in = 70, n = 5;
  std::vector<float> w(out * in), x(n * in);
  for (std::size_t i = 0; i < w.size(); ++i) w[i] = std::sin(static_cast<float>(i) * 0.37f);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = std::cos(static_cast<float>(i) * 0.11f);
  for (Dtype dt : {Dtype::f32, Dtype::bf16}) {
    const auto t = make(dt, {static_cast<std::int64_t>(out), static_cast<std::int64_t>(in)}, w);
    std::vector<float> widened(out * in);
    cpu::to_f32(t.ref(), 0, widened.size(), widened.data());
    for (std::size_t threads : {1u, 2u, 7u}) {
      std::vector<float> y(n * out, -1.0f);
      cpu::matmul(t.ref(), x.data(), n, y.data(), threads);
      double worst = 0;
      for (std::size_t r = 0; r < n; ++r)
        for (std::size_t o = 0; o < out; ++o) {
          double s = 0;
          for (std::size_t i = 0; i < in; ++i) s += static_cast<double>(widened[o * in + i]) * x[r * in + i];
          worst = std::max(worst, std::fabs(s - y[r * out + o]));
        }
      INFO("dtype " << to_string(dt) << ", threads " << threads);
      CHECK(worst < 1e-4);
    }
  }
}

TEST_CASE("rope matches the rotate_half formula; position 0 is the identity") {
  const std::size_t heads = 3, hd = 16;
  const double theta = 1e6;
  const std::vector<float> inv_freq = rope_inv_freq(theta, hd, RopeScaling{});
  std::vector<float> x(heads * hd);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i) * 0.1f - 2.0f;
  auto y = x;
  cpu::rope(y.data(), heads, hd, hd, 0, inv_freq.data());
  CHECK(y == x);
  for (std::int64_t pos : {1, 17, 4095}) {
    std::vector<float> fresh(x);  // a new vector, not y = x: GCC 12's -O3 reports a false stringop-overflow on the reassignment
    y.swap(fresh);
    cpu::rope(y.data(), heads, hd, hd, pos, inv_freq.data());
    double worst = 0;
    for (std::size_t h = 0; h < heads; ++h)
      for (std::size_t i = 0; i < hd / 2; ++i) {
        const double f = std::pow(theta, -2.0 * static_cast<double>(i) / hd);
        const double c = std::cos(static_cast<double>(pos) * f), s = std::sin(static_cast<double>(pos) * f);
        const double a = x[h * hd + i], b = x[h * hd + i + hd / 2];
        worst = std::max(worst, std::fabs(a * c - b * s - y[h * hd + i]));
        worst = std::max(worst, std::fabs(b * c + a * s - y[h * hd + i + hd / 2]));
      }
    INFO("pos " << pos);
    // note: fp32 angles (as transformers forms them) lose ~pos * 6e-8 rad against double.
    CHECK(worst < 1e-3);
  }
}

TEST_CASE("partial rotary rotates the leading dims only; the attention factor scales them, not the rest") {
  const std::size_t heads = 2, hd = 16, rot = 8;
  const std::vector<float> inv_freq = rope_inv_freq(1e4, rot, RopeScaling{});
  REQUIRE(inv_freq.size() == rot / 2);
  std::vector<float> x(heads * hd);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = 0.3f * static_cast<float>(i % 7) - 0.8f;
  auto y = x;
  cpu::rope(y.data(), heads, hd, rot, 5, inv_freq.data(), 1.25f);
  for (std::size_t h = 0; h < heads; ++h) {
    for (std::size_t i = rot; i < hd; ++i) CHECK(y[h * hd + i] == x[h * hd + i]);  // passed through, unscaled
    for (std::size_t i = 0; i < rot / 2; ++i) {
      const double f = std::pow(1e4, -2.0 * static_cast<double>(i) / rot);
      const double a = x[h * hd + i], b = x[h * hd + i + rot / 2];
      const double c = std::cos(5.0 * f) * 1.25, s = std::sin(5.0 * f) * 1.25;
      CHECK(y[h * hd + i] == doctest::Approx(a * c - b * s).epsilon(1e-5));
      CHECK(y[h * hd + i + rot / 2] == doctest::Approx(b * c + a * s).epsilon(1e-5));
    }
  }
}

TEST_CASE("rms_norm scales each row to unit RMS times the weight") {
  const std::vector<float> x{3, 4, 0, 0, 1, 1, 1, 1};
  const std::vector<float> w{1, 2, 1, 1};
  std::vector<float> y(8);
  cpu::rms_norm(x.data(), w.data(), 2, 4, 0.0, y.data());
  CHECK(y[0] == doctest::Approx(3 / 2.5));
  CHECK(y[1] == doctest::Approx(2 * 4 / 2.5));
  CHECK(y[4] == doctest::Approx(1.0));
  CHECK(y[5] == doctest::Approx(2.0));
}

TEST_CASE("parallel_for covers every index exactly once") {
  for (std::size_t n : {1u, 2u, 3u, 100u, 1001u}) {
    std::vector<std::atomic<int>> hits(n);
    cpu::parallel_for(n, 4, 1u << 30, [&](std::size_t b, std::size_t e) {
      for (std::size_t i = b; i < e; ++i) hits[i]++;
    });
    for (std::size_t i = 0; i < n; ++i) CHECK(hits[i] == 1);
  }
}
