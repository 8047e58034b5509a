// Random ids for the objects servedeck names itself: "msg_…", "resp_…", "toolu_…", "call_…".
#pragma once

#include <cstdint>
#include <cstdio>
#include <mutex>
#include <random>
#include <string>
#include <string_view>

namespace servedeck {

/// `prefix` + "_" + 24 random hex digits ("msg_3f9a…"): 96 bits from one process-wide
/// mt19937_64 seeded by std::random_device. Unique enough to tell objects apart, not a secret
/// (never a credential). Thread-safe.
inline std::string random_id(std::string_view prefix) {
  static std::mutex mu;
  static std::mt19937_64 rng{std::random_device{}()};
  uint64_t a = 0, b = 0;
  {
    std::lock_guard<std::mutex> lock(mu);
    a = rng();
    b = rng();
  }
  char hex[32];
  std::snprintf(hex, sizeof hex, "%016llx%08llx", static_cast<unsigned long long>(a),
                static_cast<unsigned long long>(b & 0xffffffffULL));
  std::string out(prefix);
  out += '_';
  out += hex;
  return out;
}

}  // namespace servedeck
