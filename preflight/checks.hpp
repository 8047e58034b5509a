// The individual preflight checks. Each appends one or more CheckResult rows; none stops the others.
// Internal to servedeck_preflight; run_preflight (preflight.cpp) calls them in table order, and
// that table gives each check its Stage (before or after the running engine is stopped).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "preflight/preflight.hpp"

namespace servedeck::preflight::checks {

/// Everything a check may look at.
struct Context {
  const registry::Registry& reg;
  const registry::ModelEntry& m;
  Readings& readings;
  const registry::LaunchSpec& launch;
  const std::optional<MeasuredFigures>& measured;
  std::vector<CheckResult>& out;
  Stage stage = Stage::machine;  // stamped on every row add() appends (run_preflight sets it per check)

  void add(std::string check, Verdict v, std::string reading, std::string limit, std::string message);
};

/// note: loader transient copies beyond the offload, GiB (see registry/parse_model.cpp).
constexpr double kLoaderTransientGib = 30;
/// note: a declaration further than this from the last measurement is flagged (issue 6 §4).
constexpr double kMeasuredTolerance = 0.10;

void gpu_present(Context& c);      // "gpu": engines that need a GPU refuse without one
void vram_fit(Context& c);         // "vram_fit": util × total must be free; names every holder
void cuda_processes(Context& c);   // "cuda_processes": pinned engines refuse beside another CUDA process
void host_ram(Context& c);         // "host_ram": MemAvailable ≥ host_ram_gib
void context(Context& c);          // "ctx_validated", "ctx_prefilled", "ctx_model_max", "kv_cap"
void shm(Context& c);              // "shm": /dev/shm free ≥ shm_gib
void ptrace(Context& c);           // "ptrace_scope": uses_cuda_ipc needs 0
void memlock(Context& c);          // "memlock": pinned engines: RLIMIT_MEMLOCK ≥ offload (warn)
void files(Context& c);            // "checkpoint", "program", "hot_profile"
void consistency(Context& c);      // "offload_consistency": env vs argv vs cpu_offload_gib; RAM ≥ offload + 30
void experts(Context& c);          // "expert_bytes", "hot_cache": native entries, in the checkpoint's format
void measured(Context& c);         // "measured_host_ram", "measured_vram"
void rules(Context& c);            // "rule:<id>" per matching [[rules]] entry, or one "rules" pass row

/// "70.2 GiB" (one decimal).
std::string gib(double v);
/// "70.2 GiB" at or above 1 GiB, "8 MiB" below, "unlimited" for +inf.
std::string size_text(double v);
/// Shortest round-trip text of a declared number: "155", "0.95".
std::string num(double v);

}  // namespace servedeck::preflight::checks
