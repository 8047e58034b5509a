#include "worker/model/rope.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace servedeck::worker {

std::string_view to_string(RopeScalingKind k) {
  switch (k) {
    case RopeScalingKind::none: return "none";
    case RopeScalingKind::yarn: return "yarn";
  }
  return "?";
}

std::vector<float> rope_inv_freq(double theta, std::int64_t rotary_dim, const RopeScaling& scaling) {
  const auto half = static_cast<std::size_t>(rotary_dim / 2);
  std::vector<float> pos_freq(half);
  for (std::size_t i = 0; i < half; ++i) {
    // transformers: base ** (arange(0, dim, 2).float() / dim), the exponent in fp32.
    const float expo = static_cast<float>(2 * i) / static_cast<float>(rotary_dim);
    pos_freq[i] = static_cast<float>(std::pow(theta, static_cast<double>(expo)));
  }
  std::vector<float> inv(half);
  if (scaling.kind == RopeScalingKind::none) {
    for (std::size_t i = 0; i < half; ++i) inv[i] = 1.0f / pos_freq[i];
    return inv;
  }
  // YaRN (rope.hpp). The correction range is computed in double, as Python floats.
  const double d = static_cast<double>(rotary_dim);
  const double L = static_cast<double>(scaling.original_max_position_embeddings);
  auto correction_dim = [&](double rotations) {
    return d * std::log(L / (rotations * 2.0 * std::numbers::pi)) / (2.0 * std::log(theta));
  };
  double low = correction_dim(scaling.beta_fast), high = correction_dim(scaling.beta_slow);
  if (scaling.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, d - 1.0);
  if (low == high) high += 0.001;  // transformers: prevents a division by zero
  const auto factor = static_cast<float>(scaling.factor);
  const auto span = static_cast<float>(high - low);
  const auto lowf = static_cast<float>(low);
  for (std::size_t i = 0; i < half; ++i) {
    const float extrapolation = 1.0f / pos_freq[i];
    const float interpolation = 1.0f / (factor * pos_freq[i]);
    const float ramp = std::clamp((static_cast<float>(i) - lowf) / span, 0.0f, 1.0f);
    const float extrapolation_share = 1.0f - ramp;
    inv[i] = interpolation * (1.0f - extrapolation_share) + extrapolation * extrapolation_share;
  }
  return inv;
}

}  // namespace servedeck::worker
