// Precondition checks shared by the launchers (internal to worker/cuda).
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

#include "worker/cuda/cuda_check.hpp"

namespace servedeck::worker::cuda::detail {

inline void require(bool ok, const char* launcher, const std::string& what) {
  if (!ok) throw std::invalid_argument(std::string(launcher) + ": " + what);
}

inline bool aligned16(const void* p) { return (reinterpret_cast<std::uintptr_t>(p) & 15u) == 0; }
inline bool aligned8(const void* p) { return (reinterpret_cast<std::uintptr_t>(p) & 7u) == 0; }

/// After a launch: cudaGetLastError() through CUDA_CHECK.
inline void check_launch() { CUDA_CHECK(cudaGetLastError()); }

}  // namespace servedeck::worker::cuda::detail
