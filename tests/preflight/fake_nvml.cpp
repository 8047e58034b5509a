// A fake libnvidia-ml for tests of the dlopen loader: one GPU (index 0) with canned memory, compute
// capability 12.0, and processes that exercise the loader's paths (INSUFFICIENT_SIZE retry, a
// usedGpuMemory of NVML_VALUE_NOT_AVAILABLE, a pid in both the compute and graphics lists).
// Layouts copied from nvml.h as the loader declares them. fake_nvml_calls_in_flight_max() tells a
// test how many threads were inside the library at once (the readings must serialise them).
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>

namespace {
struct Memory {
  unsigned long long total, free, used;
};
struct ProcessInfo {
  unsigned int pid;
  unsigned long long usedGpuMemory;
  unsigned int gpuInstanceId;
  unsigned int computeInstanceId;
};
int g_device = 0;
constexpr unsigned long long kMiB = 1024ULL * 1024;
std::atomic<int> g_inside{0};
std::atomic<int> g_inside_max{0};
std::atomic<int> g_inits{0};

/// Marks one call inside the library for its duration (2 ms, long enough for callers to overlap).
struct Inside {
  Inside() {
    int now = ++g_inside;
    int seen = g_inside_max.load();
    while (now > seen && !g_inside_max.compare_exchange_weak(seen, now)) {
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  ~Inside() { --g_inside; }
};

int fill(unsigned* count, void* out, const ProcessInfo* src, unsigned n) {
  if (*count < n) {
    *count = n;
    return 7;  // NVML_ERROR_INSUFFICIENT_SIZE
  }
  std::memcpy(out, src, n * sizeof(ProcessInfo));
  *count = n;
  return 0;
}
}  // namespace

extern "C" {
int fake_nvml_calls_in_flight_max() { return g_inside_max.load(); }
int fake_nvml_inits() { return g_inits.load(); }
int nvmlInit_v2() {
  Inside in;
  ++g_inits;
  return 0;
}
int nvmlShutdown() { return 0; }
const char* nvmlErrorString(int) { return "fake NVML error"; }
int nvmlDeviceGetHandleByIndex_v2(unsigned index, void** device) {
  if (index != 0) return 2;  // NVML_ERROR_INVALID_ARGUMENT
  *device = &g_device;
  return 0;
}
int nvmlDeviceGetMemoryInfo(void*, Memory* m) {
  Inside in;
  m->total = 96ULL * 1024 * kMiB;
  m->free = 30ULL * 1024 * kMiB;
  m->used = 66ULL * 1024 * kMiB;
  return 0;
}
int nvmlDeviceGetCudaComputeCapability(void*, int* major, int* minor) {
  *major = 12;
  *minor = 0;
  return 0;
}
int nvmlDeviceGetComputeRunningProcesses_v3(void*, unsigned* count, void* out) {
  Inside in;
  // The caller's own pid, so /proc/PID/comm resolves to a name.
  const ProcessInfo procs[] = {{static_cast<unsigned>(::getpid()), 58000 * kMiB, 0, 0},
                               {4242, ~0ULL, 0, 0}};
  // Force one INSUFFICIENT_SIZE round trip when the caller offers fewer than 100 slots.
  static bool asked_once = false;
  if (!asked_once) {
    asked_once = true;
    if (*count < 100) {
      *count = 100;
      return 7;
    }
  }
  return fill(count, out, procs, 2);
}
int nvmlDeviceGetGraphicsRunningProcesses_v3(void*, unsigned* count, void* out) {
  const ProcessInfo procs[] = {{777, 1024 * kMiB, 0, 0}, {static_cast<unsigned>(::getpid()), 10 * kMiB, 0, 0}};
  return fill(count, out, procs, 2);
}
}
