// What the supervisor asks of an engine and of the GPU: the health and warm-up probes that
// define "ready", and the GPU-memory probe that defines "stopped".
//
// Thread-safety: free functions have no shared state; a GpuMemoryProbe implementation must be
// callable from the supervisor's threads (one call at a time).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace servedeck::preflight {
class Readings;
}

namespace servedeck::supervisor {

struct ProbeResult {
  bool ok = false;
  int status = 0;          // HTTP status; 0 when no answer (connection refused, timeout)
  std::string detail;      // the client error, or the first 300 bytes of a non-200 body
};

/// GET http://host:port`path`; ok when 200.
ProbeResult probe_health(const std::string& host, int port, const std::string& path, int timeout_ms);

/// POST /v1/completions {"model": served_name, "prompt": "hi", "max_tokens": 1}; ok when 200
/// and the body is JSON with a non-empty "choices" array (G26: an engine can answer health 200
/// while every completion fails).
ProbeResult probe_warmup(const std::string& host, int port, const std::string& served_name, int timeout_ms);

/// GPU memory held by a set of processes.
class GpuMemoryProbe {
 public:
  virtual ~GpuMemoryProbe() = default;
  /// MiB of GPU memory held by any of `pids` on the slot's GPU; nullopt when there is no GPU
  /// (or no driver): then the VRAM-release wait is skipped.
  virtual std::optional<double> used_mib(const std::vector<int64_t>& pids) = 0;
};

/// No GPU: always nullopt.
class NoGpuProbe : public GpuMemoryProbe {
 public:
  std::optional<double> used_mib(const std::vector<int64_t>&) override { return std::nullopt; }
};

/// NVML through preflight::Readings::gpu_processes(gpu). `readings` must outlive the probe.
class ReadingsGpuProbe : public GpuMemoryProbe {
 public:
  ReadingsGpuProbe(preflight::Readings& readings, int gpu) : readings_(readings), gpu_(gpu) {}
  std::optional<double> used_mib(const std::vector<int64_t>& pids) override;

 private:
  preflight::Readings& readings_;
  int gpu_;
};

}  // namespace servedeck::supervisor
