// NVML loaded at run time with dlopen("libnvidia-ml.so.1"): no link-time dependency on the driver,
// so the daemon runs (and reports "no GPU") on machines without one. Only the few entry points
// preflight and the supervisor need; the structs are declared locally with NVML's layout.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace servedeck::preflight {

/// One process with a context on a GPU. used_bytes is 0 when the driver does not report it.
struct NvmlProcess {
  uint32_t pid = 0;
  uint64_t used_bytes = 0;
};

/// Thread-safety: not thread-safe; use one instance per thread or guard externally.
class Nvml {
 public:
  /// Loads `library` (the driver's libnvidia-ml.so.1 by default; tests pass a fake) and calls
  /// nvmlInit_v2. Never throws: on failure available() is false and error() says why
  /// ("no GPU: libnvidia-ml.so.1 could not be loaded (no NVIDIA driver?): ...").
  explicit Nvml(const std::string& library = "libnvidia-ml.so.1");
  ~Nvml();
  Nvml(const Nvml&) = delete;
  Nvml& operator=(const Nvml&) = delete;

  bool available() const { return initialised_; }
  const std::string& error() const { return error_; }

  struct Memory {
    uint64_t total = 0, free = 0, used = 0;  // bytes
  };
  /// nullopt when the GPU index does not exist or the call fails (error() updated).
  std::optional<Memory> memory(int gpu);
  /// major*10 + minor, e.g. 90 (H100/H200), 120 (RTX PRO 6000 Blackwell).
  std::optional<int> compute_capability(int gpu);
  /// Compute and graphics processes holding memory on `gpu`, merged by pid.
  std::optional<std::vector<NvmlProcess>> processes(int gpu);

 private:
  using Device = void*;
  std::optional<Device> device(int gpu);
  std::string describe(int rc) const;

  void* lib_ = nullptr;
  bool initialised_ = false;
  std::string error_;
  // Entry points (nullptr when absent from this driver's library).
  int (*init_)() = nullptr;
  int (*shutdown_)() = nullptr;
  const char* (*error_string_)(int) = nullptr;
  int (*handle_by_index_)(unsigned, Device*) = nullptr;
  int (*memory_info_)(Device, void*) = nullptr;
  int (*compute_capability_)(Device, int*, int*) = nullptr;
  int (*compute_procs_)(Device, unsigned*, void*) = nullptr;   // _v3 or _v2 (same struct)
  int (*graphics_procs_)(Device, unsigned*, void*) = nullptr;  // _v3 or _v2
};

}  // namespace servedeck::preflight
