// The real readings on this machine: never crash; without a GPU, say so.
#include <doctest/doctest.h>

#include <cmath>

#include "preflight/nvml.hpp"
#include "preflight/preflight.hpp"
#include "registry/registry.hpp"

using namespace servedeck::preflight;

TEST_CASE("system readings: /proc and limits are read; GPU either read or explained") {
  auto r = system_readings();
  auto mem = r->mem_available_gib();
  REQUIRE(mem.has_value());
  CHECK(*mem > 0);
  auto ml = r->memlock_limit_gib();
  REQUIRE(ml.has_value());
  CHECK(*ml >= 0);
  CHECK(r->path_exists("/proc/self"));
  CHECK(r->is_executable("/bin/sh"));
  CHECK_FALSE(r->is_executable("/proc/self"));
  auto total = r->gpu_total_gib(0);
  if (total) {
    CHECK(*total > 0);
    auto used = r->gpu_used_gib(0);
    REQUIRE(used.has_value());
    CHECK(*used <= *total);
    auto cc = r->gpu_compute_capability(0);
    REQUIRE(cc.has_value());
    CHECK(*cc >= 50);
    MESSAGE("GPU 0: " << *total << " GiB, cc " << *cc << ", " << r->gpu_processes(0).size() << " processes");
  } else {
    CHECK(r->gpu_error().find("no GPU") != std::string::npos);
    CHECK(r->gpu_processes(0).empty());
  }
  Nvml nvml;
  if (!nvml.available()) CHECK_FALSE(nvml.error().empty());
  CHECK_FALSE(nvml.memory(4096).has_value());  // an index no machine has: an error, not a crash
}

TEST_CASE("system preflight of the shipped entries runs end to end") {
  auto reg = servedeck::registry::load_registry(std::string(SERVEDECK_SOURCE_DIR) + "/models.toml");
  auto r = system_readings();
  for (const auto& m : reg.models) {
    Report rep = run_preflight(reg, m, *r, 0);
    CHECK_FALSE(rep.checks.empty());
    if (m.name == "glm53") MESSAGE(rep.table());
  }
}
