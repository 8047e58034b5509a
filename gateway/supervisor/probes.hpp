// What the supervisor asks of an engine and of the GPU: the health and warm-up probes that
// define "ready", and the GPU-memory probe that defines "stopped".
//
// Thread-safety: free functions have no shared state; a GpuMemoryProbe implementation must be
// callable from the supervisor's threads (one call at a time).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace servedeck::preflight {
class Readings;
}

namespace servedeck::supervisor {

struct ProbeResult {
  bool ok = false;
  int status = 0;          // HTTP status; 0 when no answer (connection refused, timeout)
  std::string detail;      // the client error, or utf8_excerpt(body, k_probe_excerpt_bytes) of a non-200 body
};

/// Bytes of an engine's body quoted in a probe failure.
inline constexpr std::size_t k_probe_excerpt_bytes = 300;

/// `text` as valid UTF-8 of at most `max_bytes` bytes: cut only between characters (a character
/// that would cross the limit is left out), every invalid or truncated sequence replaced by
/// U+FFFD. Engine output is outside text: what reaches an event, last_error or a JSON answer
/// passes through this first, so no serialisation of it can fail. Linear in text.size().
std::string utf8_excerpt(std::string_view text, std::size_t max_bytes = static_cast<std::size_t>(-1));

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
