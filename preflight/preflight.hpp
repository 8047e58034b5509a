// Preflight: the checks run before any launch. Each check passes, warns or refuses, and names
// what it read and what it compared against. See docs/preflight.md.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "registry/model_entry.hpp"
#include "registry/registry.hpp"

namespace servedeck::preflight {

enum class Verdict { pass, warn, refuse };
std::string_view to_string(Verdict v);

/// Whether stopping the engine that is running now can change a check's verdict. `switch` runs
/// the `declaration` checks before it stops the running engine (a refusal there leaves the running
/// model serving) and every check after the stop. Each check's stage, with the reason, is in the
/// table in preflight/preflight.cpp.
enum class Stage {
  declaration,  // depends on the registry entry, files on disk, system settings and which GPU is present
  machine,      // depends on what the running engine holds: free VRAM, MemAvailable, /dev/shm, CUDA processes
};
std::string_view to_string(Stage s);

/// Which checks run_preflight runs.
enum class Scope {
  all,               // every check (the full preflight: `servedeck preflight`, and `switch` after the stop)
  declaration_only,  // only Stage::declaration checks (`switch` before stopping the running engine)
};

struct CheckResult {
  std::string check;     // "host_ram", "vram_fit", "ctx_validated", "rule:<id>", ...
  Verdict verdict = Verdict::pass;
  std::string reading;   // what was read, with units: "MemAvailable 70.2 GiB"
  std::string limit;     // what it was compared against: "host_ram_gib 155 GiB"
  std::string message;   // one line; a refusal contains both numbers
  /// Set by run_preflight from the check's table entry. Default `machine`: a row nobody classified
  /// never refuses a switch before the running engine is stopped.
  Stage stage = Stage::machine;
};

/// A process holding GPU memory (from NVML).
struct GpuProcess {
  int64_t pid = 0;
  std::string name;      // from /proc/PID/comm
  double used_mib = 0;
};

/// Everything preflight reads from the machine, behind one interface so tests inject readings
/// (CI has no GPU). SystemReadings reads /proc, statvfs, getrlimit and NVML (dlopen'ed).
/// Thread-safety: implementations must allow calls from several threads at once (the daemon's
/// supervisor, status and admin threads share one instance).
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

/// The real machine. Thread-safe: the daemon's threads (switch, status, admin preflight) share one
/// instance; NVML is loaded and initialised once, on the first GPU reading, its calls are
/// serialised by an internal mutex, and it is shut down when the object is destroyed.
std::unique_ptr<Readings> system_readings();
/// Same, loading NVML from `nvml_library` instead of libnvidia-ml.so.1 (tests use a fake).
std::unique_ptr<Readings> system_readings(const std::string& nvml_library);

/// The last figures measured for this model after a launch reached ready (the state store keeps
/// them per (model, ctx, engine build); the caller passes them in so preflight does not depend on
/// the store). Preflight shows them beside the declared values and warns when a declaration is
/// more than 10% off: host_ram_gib vs peak host RSS, util × GPU total vs peak VRAM.
struct MeasuredFigures {
  std::optional<double> peak_vram_gib;   // GiB
  std::optional<double> host_rss_gib;    // GiB, peak host RSS of the engine's process group
  std::optional<double> load_time_s;     // s, start to ready
  int64_t ctx = 0;                       // tokens, the ctx those figures were measured at
  std::string engine_build;              // as recorded
  std::string measured_at;               // ISO-8601 UTC, as recorded
};

struct Report {
  std::string model;
  std::vector<CheckResult> checks;
  registry::LaunchSpec launch;         // rendered argv and env
  std::optional<MeasuredFigures> measured;  // as passed to run_preflight
  bool refused() const;                // any refusal
  /// {"model","refused","checks":[{"check","verdict","reading","limit","message","stage"}],
  ///  "launch":{"program","argv","env","host","port"},"measured":{...}|null}
  nlohmann::json to_json() const;
  /// Aligned text table for the CLI: one row per check (check, verdict, reading, limit), the
  /// message under each row that is not a pass, then the rendered env and argv.
  std::string table() const;
  /// The refusal messages, one per line ("" when none): what `switch` prints when it stops.
  std::string refusals() const;
};

/// Runs every check for `m` (including the registry's [[rules]]); collects all results (never
/// stops at the first refusal). `port` is the port the launch would use. `measured`: the last
/// measured figures for this model, if the caller has them. `scope`: Scope::declaration_only runs
/// only the checks whose verdict cannot change by stopping the running engine. Never throws for
/// machine readings.
Report run_preflight(const registry::Registry& reg, const registry::ModelEntry& m, Readings& readings,
                     int port, const std::optional<MeasuredFigures>& measured = std::nullopt,
                     Scope scope = Scope::all);

/// The rows of `r` whose stage is Stage::declaration (same model, launch and measured figures).
Report declaration_rows(const Report& r);

}  // namespace servedeck::preflight
