#include "preflight/nvml.hpp"

#include <dlfcn.h>

#include <algorithm>
#include <map>

namespace servedeck::preflight {

namespace {

// Layouts from nvml.h (NVML API version 11+/12), declared here so nothing links the driver.
struct NvmlMemoryT {
  unsigned long long total;
  unsigned long long free;
  unsigned long long used;
};
struct NvmlProcessInfoV2T {  // nvmlProcessInfo_v2_t, used by the _v2 and _v3 process queries
  unsigned int pid;
  unsigned long long usedGpuMemory;
  unsigned int gpuInstanceId;
  unsigned int computeInstanceId;
};
constexpr int kSuccess = 0;
constexpr int kInsufficientSize = 7;
constexpr unsigned long long kValueNotAvailable = ~0ULL;

template <typename F>
F sym(void* lib, const char* name) {
  return reinterpret_cast<F>(::dlsym(lib, name));
}

}  // namespace

Nvml::Nvml(const std::string& library) {
  lib_ = ::dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!lib_) {
    const char* why = ::dlerror();
    error_ = "no GPU: " + library + " could not be loaded (no NVIDIA driver?): " + (why ? why : "");
    return;
  }
  init_ = sym<int (*)()>(lib_, "nvmlInit_v2");
  shutdown_ = sym<int (*)()>(lib_, "nvmlShutdown");
  error_string_ = sym<const char* (*)(int)>(lib_, "nvmlErrorString");
  handle_by_index_ = sym<int (*)(unsigned, Device*)>(lib_, "nvmlDeviceGetHandleByIndex_v2");
  memory_info_ = sym<int (*)(Device, void*)>(lib_, "nvmlDeviceGetMemoryInfo");
  compute_capability_ = sym<int (*)(Device, int*, int*)>(lib_, "nvmlDeviceGetCudaComputeCapability");
  compute_procs_ = sym<int (*)(Device, unsigned*, void*)>(lib_, "nvmlDeviceGetComputeRunningProcesses_v3");
  if (!compute_procs_) compute_procs_ = sym<int (*)(Device, unsigned*, void*)>(lib_, "nvmlDeviceGetComputeRunningProcesses_v2");
  graphics_procs_ = sym<int (*)(Device, unsigned*, void*)>(lib_, "nvmlDeviceGetGraphicsRunningProcesses_v3");
  if (!graphics_procs_) graphics_procs_ = sym<int (*)(Device, unsigned*, void*)>(lib_, "nvmlDeviceGetGraphicsRunningProcesses_v2");
  if (!init_ || !handle_by_index_ || !memory_info_) {
    error_ = "no GPU: " + library + " lacks nvmlInit_v2/nvmlDeviceGetHandleByIndex_v2/nvmlDeviceGetMemoryInfo";
    return;
  }
  int rc = init_();
  if (rc != kSuccess) {
    error_ = "no GPU: nvmlInit_v2 failed: " + describe(rc);
    return;
  }
  initialised_ = true;
}

Nvml::~Nvml() {
  if (initialised_ && shutdown_) shutdown_();
  if (lib_) ::dlclose(lib_);
}

std::string Nvml::describe(int rc) const {
  std::string s = error_string_ ? error_string_(rc) : "NVML error";
  return s + " (" + std::to_string(rc) + ")";
}

std::optional<Nvml::Device> Nvml::device(int gpu) {
  if (!initialised_) return std::nullopt;
  Device d = nullptr;
  int rc = handle_by_index_(static_cast<unsigned>(gpu), &d);
  if (rc != kSuccess) {
    error_ = "no GPU " + std::to_string(gpu) + ": nvmlDeviceGetHandleByIndex_v2 failed: " + describe(rc);
    return std::nullopt;
  }
  return d;
}

std::optional<Nvml::Memory> Nvml::memory(int gpu) {
  auto d = device(gpu);
  if (!d) return std::nullopt;
  NvmlMemoryT m{};
  int rc = memory_info_(*d, &m);
  if (rc != kSuccess) {
    error_ = "GPU " + std::to_string(gpu) + ": nvmlDeviceGetMemoryInfo failed: " + describe(rc);
    return std::nullopt;
  }
  return Memory{m.total, m.free, m.used};
}

std::optional<int> Nvml::compute_capability(int gpu) {
  auto d = device(gpu);
  if (!d || !compute_capability_) return std::nullopt;
  int major = 0, minor = 0;
  if (compute_capability_(*d, &major, &minor) != kSuccess) return std::nullopt;
  return major * 10 + minor;
}

std::optional<std::vector<NvmlProcess>> Nvml::processes(int gpu) {
  auto d = device(gpu);
  if (!d) return std::nullopt;
  std::map<uint32_t, uint64_t> merged;
  for (auto fn : {compute_procs_, graphics_procs_}) {
    if (!fn) continue;
    std::vector<NvmlProcessInfoV2T> buf(64);
    for (int attempt = 0; attempt < 4; ++attempt) {
      unsigned count = static_cast<unsigned>(buf.size());
      int rc = fn(*d, &count, buf.data());
      if (rc == kInsufficientSize) {
        buf.resize(count + 16);
        continue;
      }
      if (rc != kSuccess) {
        error_ = "GPU " + std::to_string(gpu) + ": process query failed: " + describe(rc);
        break;
      }
      for (unsigned i = 0; i < count && i < buf.size(); ++i) {
        uint64_t used = buf[i].usedGpuMemory == kValueNotAvailable ? 0 : buf[i].usedGpuMemory;
        merged[buf[i].pid] = std::max(merged[buf[i].pid], used);
      }
      break;
    }
  }
  std::vector<NvmlProcess> out;
  for (const auto& [pid, used] : merged) out.push_back(NvmlProcess{pid, used});
  return out;
}

}  // namespace servedeck::preflight
