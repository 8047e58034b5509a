// Preflight: the checks run before any launch. Each check passes, warns or refuses, and names
// what it read and what it compared against. See docs/preflight.md.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "registry/model_entry.hpp"
#include "registry/registry.hpp"

namespace servedeck::preflight {

enum class Verdict { pass, warn, refuse };
std::string_view to_string(Verdict v);

struct CheckResult {
  std::string check;     // "host_ram", "vram_fit", "ctx_validated", "rule:<id>", ...
  Verdict verdict = Verdict::pass;
  std::string reading;   // what was read, with units: "MemAvailable 70.2 GiB"
  std::string limit;     // what it was compared against: "host_ram_gib 155 GiB"
  std::string message;   // one line; a refusal contains both numbers
};

/// A process holding GPU memory (from NVML).
struct GpuProcess {
  int64_t pid = 0;
  std::string name;      // from /proc/PID/comm
  double used_mib = 0;
};

/// Everything preflight reads from the machine, behind one interface so tests inject readings
/// (CI has no GPU). SystemReadings reads /proc, statvfs, getrlimit and NVML (dlopen'ed).
class Readings {
 public:
  virtual ~Readings() = default;
  virtual std::optional<double> mem_available_gib() = 0;      // /proc/meminfo MemAvailable
  /// nullopt + gpu_error() when no GPU or no driver.
  virtual std::optional<double> gpu_total_gib(int gpu) = 0;
  virtual std::optional<double> gpu_used_gib(int gpu) = 0;
  virtual std::optional<int> gpu_compute_capability(int gpu) = 0;  // e.g. 90, 120
  virtual std::vector<GpuProcess> gpu_processes(int gpu) = 0;
  virtual std::string gpu_error() = 0;                       // why GPU readings are missing
  virtual std::optional<double> shm_free_gib() = 0;          // statvfs("/dev/shm")
  virtual std::optional<int> ptrace_scope() = 0;             // /proc/sys/kernel/yama/ptrace_scope
  virtual std::optional<double> memlock_limit_gib() = 0;     // RLIMIT_MEMLOCK soft; +inf when unlimited
  virtual bool path_exists(const std::string& path) = 0;
  virtual bool is_executable(const std::string& path) = 0;
};

/// The real machine.
std::unique_ptr<Readings> system_readings();

struct Report {
  std::string model;
  std::vector<CheckResult> checks;
  registry::LaunchSpec launch;         // rendered argv and env
  bool refused() const;                // any refusal
  nlohmann::json to_json() const;
  std::string table() const;           // aligned text table for the CLI
};

/// Runs every check for `m` (including the registry's [[rules]]); collects all results (never
/// stops at the first refusal). `port` is the port the launch would use.
Report run_preflight(const registry::Registry& reg, const registry::ModelEntry& m, Readings& readings,
                     int port);

}  // namespace servedeck::preflight
