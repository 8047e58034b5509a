// Readings from the real machine: /proc/meminfo, NVML (dlopen'ed), statvfs("/dev/shm"),
// /proc/sys/kernel/yama/ptrace_scope, getrlimit(RLIMIT_MEMLOCK), stat/access.
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <fstream>
#include <limits>
#include <mutex>
#include <sstream>
#include <string>
#include <utility>

#include "preflight/nvml.hpp"
#include "preflight/preflight.hpp"

namespace servedeck::preflight {

namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

class SystemReadings final : public Readings {
 public:
  explicit SystemReadings(std::string nvml_library) : nvml_library_(std::move(nvml_library)) {}

  std::optional<double> mem_available_gib() override {
    std::ifstream in("/proc/meminfo");
    std::string key;
    while (in >> key) {
      if (key == "MemAvailable:") {
        double kib = 0;
        in >> kib;
        return kib / (1024.0 * 1024.0);
      }
      std::string rest;
      std::getline(in, rest);
    }
    return std::nullopt;
  }
  std::optional<double> gpu_total_gib(int gpu) override {
    std::lock_guard lk(nvml_mu_);
    auto m = nvml().memory(gpu);
    if (!m) return std::nullopt;
    return static_cast<double>(m->total) / kGiB;
  }
  std::optional<double> gpu_used_gib(int gpu) override {
    std::lock_guard lk(nvml_mu_);
    auto m = nvml().memory(gpu);
    if (!m) return std::nullopt;
    // note: total - free, not `used`: NVML's `used` excludes memory the driver reserves, and what
    // the next engine can allocate is `free`.
    return static_cast<double>(m->total - m->free) / kGiB;
  }
  std::optional<int> gpu_compute_capability(int gpu) override {
    std::lock_guard lk(nvml_mu_);
    return nvml().compute_capability(gpu);
  }
  std::vector<GpuProcess> gpu_processes(int gpu) override {
    std::vector<GpuProcess> out;
    std::optional<std::vector<NvmlProcess>> procs;
    {
      std::lock_guard lk(nvml_mu_);
      procs = nvml().processes(gpu);
    }
    if (!procs) return out;
    for (const auto& p : *procs) {
      GpuProcess g;
      g.pid = p.pid;
      std::ifstream comm("/proc/" + std::to_string(p.pid) + "/comm");
      if (!std::getline(comm, g.name)) g.name = "?";
      g.used_mib = static_cast<double>(p.used_bytes) / (1024.0 * 1024.0);
      out.push_back(g);
    }
    return out;
  }
  std::string gpu_error() override {
    std::lock_guard lk(nvml_mu_);
    return nvml().error();
  }
  std::optional<double> shm_free_gib() override {
    struct statvfs s {};
    if (::statvfs("/dev/shm", &s) != 0) return std::nullopt;
    return static_cast<double>(s.f_bavail) * static_cast<double>(s.f_frsize) / kGiB;
  }
  std::optional<int> ptrace_scope() override {
    std::ifstream in("/proc/sys/kernel/yama/ptrace_scope");
    int v = 0;
    if (!(in >> v)) return std::nullopt;
    return v;
  }
  std::optional<double> memlock_limit_gib() override {
    struct rlimit r {};
    if (::getrlimit(RLIMIT_MEMLOCK, &r) != 0) return std::nullopt;
    if (r.rlim_cur == RLIM_INFINITY) return std::numeric_limits<double>::infinity();
    return static_cast<double>(r.rlim_cur) / kGiB;
  }
  bool path_exists(const std::string& path) override {
    struct stat st {};
    return ::stat(path.c_str(), &st) == 0;
  }
  bool is_executable(const std::string& path) override {
    struct stat st {};
    return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(path.c_str(), X_OK) == 0;
  }

 private:
  /// Call with nvml_mu_ held.
  Nvml& nvml() {
    if (!nvml_) nvml_ = std::make_unique<Nvml>(nvml_library_);
    return *nvml_;
  }
  std::string nvml_library_;
  // note: one mutex for the lazy load and every NVML call: Nvml keeps its last error in a member
  // and is documented single-threaded; the daemon's threads share this Readings object.
  std::mutex nvml_mu_;
  std::unique_ptr<Nvml> nvml_;
};

}  // namespace

std::unique_ptr<Readings> system_readings() { return std::make_unique<SystemReadings>("libnvidia-ml.so.1"); }

std::unique_ptr<Readings> system_readings(const std::string& nvml_library) {
  return std::make_unique<SystemReadings>(nvml_library);
}

}  // namespace servedeck::preflight
