// Arithmetic on token counts that come from outside (a client's max_tokens, an engine's prompt
// count): saturating instead of overflowing, so a budget near INT64_MAX is just a large budget.
#pragma once

#include <cstdint>
#include <limits>

#include <nlohmann/json.hpp>

namespace servedeck::policies {

inline constexpr int64_t k_tokens_max = std::numeric_limits<int64_t>::max();
inline constexpr int64_t k_tokens_min = std::numeric_limits<int64_t>::min();

/// a + b, clamped to the int64 range.
inline int64_t saturating_add(int64_t a, int64_t b) {
  int64_t r = 0;
  return __builtin_add_overflow(a, b, &r) ? (b > 0 ? k_tokens_max : k_tokens_min) : r;
}

/// a − b, clamped to the int64 range.
inline int64_t saturating_sub(int64_t a, int64_t b) {
  int64_t r = 0;
  return __builtin_sub_overflow(a, b, &r) ? (b < 0 ? k_tokens_max : k_tokens_min) : r;
}

/// An integer JSON value (is_number_integer()) as int64: one above INT64_MAX, which the parser
/// keeps unsigned, is INT64_MAX (get<int64_t>() would wrap it negative).
inline int64_t integer_tokens(const nlohmann::json& v) {
  if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(k_tokens_max)) return k_tokens_max;
  return v.get<int64_t>();
}

}  // namespace servedeck::policies
