// Injected machine readings for preflight tests (CI has no GPU).
#pragma once

#include <limits>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "preflight/preflight.hpp"

namespace servedeck::preflight::testing {

/// Defaults: a healthy GLM box (RTX PRO 6000 Blackwell: 95.6 GiB, SM120, nothing running, 300 GiB
/// available, roomy /dev/shm, ptrace 0, memlock unlimited, every path present and executable).
struct FakeReadings : Readings {
  std::optional<double> mem = 300;
  std::optional<double> total = 95.6, used = 0.5;
  std::optional<int> cc = 120;
  std::vector<GpuProcess> procs;
  std::string error = "no GPU: libnvidia-ml.so.1 could not be loaded (no NVIDIA driver?)";
  std::optional<double> shm = 92;
  std::optional<int> ptrace = 0;
  std::optional<double> memlock = std::numeric_limits<double>::infinity();
  bool all_paths = true;
  std::set<std::string> paths;  // when !all_paths: the paths that exist (and are executable)

  void no_gpu() {
    total.reset();
    used.reset();
    cc.reset();
  }
  std::optional<double> mem_available_gib() override { return mem; }
  std::optional<double> gpu_total_gib(int) override { return total; }
  std::optional<double> gpu_used_gib(int) override { return used; }
  std::optional<int> gpu_compute_capability(int) override { return cc; }
  std::vector<GpuProcess> gpu_processes(int) override { return procs; }
  std::string gpu_error() override { return total ? "" : error; }
  std::optional<double> shm_free_gib() override { return shm; }
  std::optional<int> ptrace_scope() override { return ptrace; }
  std::optional<double> memlock_limit_gib() override { return memlock; }
  bool path_exists(const std::string& p) override { return all_paths || paths.count(p); }
  bool is_executable(const std::string& p) override { return all_paths || paths.count(p); }
};

}  // namespace servedeck::preflight::testing
