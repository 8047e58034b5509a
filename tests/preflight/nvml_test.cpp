// The dlopen NVML loader against a fake libnvidia-ml (FAKE_NVML_PATH): struct layouts, the
// INSUFFICIENT_SIZE retry, merged compute/graphics lists, names from /proc, and the readings the
// preflight uses. The real library is exercised on the GPU machine (docs/preflight.md).
#include <doctest/doctest.h>

#include <dlfcn.h>
#include <unistd.h>

#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "preflight/nvml.hpp"
#include "preflight/preflight.hpp"

using namespace servedeck::preflight;

TEST_CASE("Nvml through the fake library") {
  Nvml nvml(FAKE_NVML_PATH);
  REQUIRE(nvml.available());
  auto mem = nvml.memory(0);
  REQUIRE(mem);
  CHECK(mem->total == 96ULL << 30);
  CHECK(mem->free == 30ULL << 30);
  CHECK(nvml.compute_capability(0) == 120);
  auto procs = nvml.processes(0);
  REQUIRE(procs);
  REQUIRE(procs->size() == 3);  // own pid (compute + graphics merged), 777, 4242
  for (const auto& p : *procs) {
    if (p.pid == static_cast<uint32_t>(::getpid())) CHECK(p.used_bytes == 58000ULL << 20);  // max of both lists
    if (p.pid == 4242) CHECK(p.used_bytes == 0);                                         // not available
    if (p.pid == 777) CHECK(p.used_bytes == 1024ULL << 20);
  }
  CHECK_FALSE(nvml.memory(1).has_value());
  CHECK(nvml.error().find("no GPU 1") != std::string::npos);
  CHECK(nvml.error().find("fake NVML error (2)") != std::string::npos);
}

TEST_CASE("system readings through the fake library: what preflight sees") {
  auto r = system_readings(FAKE_NVML_PATH);
  CHECK(r->gpu_total_gib(0) == doctest::Approx(96.0));
  CHECK(r->gpu_used_gib(0) == doctest::Approx(66.0));  // total - free
  CHECK(r->gpu_compute_capability(0) == 120);
  auto procs = r->gpu_processes(0);
  REQUIRE(procs.size() == 3);
  std::string own;
  std::ifstream("/proc/self/comm") >> own;
  bool found_self = false;
  for (const auto& p : procs) {
    if (p.pid == ::getpid()) {
      found_self = true;
      CHECK(p.name == own);
      CHECK(p.used_mib == doctest::Approx(58000));
    }
  }
  CHECK(found_self);
  CHECK_FALSE(r->gpu_total_gib(3).has_value());
}

TEST_CASE("a library that cannot be loaded is a clear 'no GPU', not a crash") {
  Nvml nvml("/nonexistent/libnvidia-ml.so.1");
  CHECK_FALSE(nvml.available());
  CHECK(nvml.error().find("no GPU: /nonexistent/libnvidia-ml.so.1 could not be loaded") == 0);
  CHECK_FALSE(nvml.memory(0).has_value());
  CHECK_FALSE(nvml.compute_capability(0).has_value());
  CHECK_FALSE(nvml.processes(0).has_value());
  auto r = system_readings("/nonexistent/libnvidia-ml.so.1");
  CHECK_FALSE(r->gpu_total_gib(0).has_value());
  CHECK(r->gpu_error().find("no GPU") == 0);
  CHECK(r->gpu_processes(0).empty());
}

TEST_CASE("system readings used from several threads: NVML is initialised once and called one at a time") {
  // The supervisor's switch thread (preflight, the VRAM wait), status calls on the blocking pool
  // and admin preflights all read the one Readings object of the daemon.
  void* lib = ::dlopen(FAKE_NVML_PATH, RTLD_NOW | RTLD_LOCAL);
  REQUIRE(lib);
  auto inits = reinterpret_cast<int (*)()>(::dlsym(lib, "fake_nvml_inits"));
  auto in_flight_max = reinterpret_cast<int (*)()>(::dlsym(lib, "fake_nvml_calls_in_flight_max"));
  const bool found = inits && in_flight_max;
  REQUIRE(found);
  const int inits_before = inits();
  auto r = system_readings(FAKE_NVML_PATH);
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t)
    threads.emplace_back([&r] {
      for (int i = 0; i < 10; ++i) {
        CHECK(r->gpu_total_gib(0) == doctest::Approx(96.0));
        CHECK(r->gpu_processes(0).size() == 3);
        (void)r->gpu_error();
      }
    });
  for (auto& t : threads) t.join();
  CHECK(inits() - inits_before == 1);
  CHECK(in_flight_max() == 1);
  ::dlclose(lib);
}
