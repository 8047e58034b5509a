// "expert_bytes" and "hot_cache": a native entry's offload, host RAM and VRAM declarations
// against its checkpoint's experts in the format the checkpoint ships.
#include <doctest/doctest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "preflight/preflight.hpp"
#include "registry/registry.hpp"
#include "tests/preflight/fake_readings.hpp"
#include "tests/worker/model/temp_dir.hpp"

using namespace servedeck;
using namespace servedeck::preflight;
using preflight::testing::FakeReadings;
using servedeck::test::TempDir;
using json = nlohmann::json;

namespace {

const registry::Registry& shipped() {
  static registry::Registry reg = registry::load_registry(std::string(SERVEDECK_SOURCE_DIR) + "/models.toml");
  return reg;
}

const CheckResult* find(const Report& r, const std::string& check) {
  for (const auto& c : r.checks)
    if (c.check == check) return &c;
  return nullptr;
}

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

/// The shipped Qwen3-30B-A3B synthetic entry pointed at a copy of its config.json with `quant`.
registry::ModelEntry synthetic(const TempDir& dir, const json& quant) {
  std::ifstream in(std::string(SERVEDECK_SOURCE_DIR) + "/bench/moe_offload/qwen3-30b-a3b/config.json");
  json cfg = json::parse(in);
  if (!quant.is_null()) cfg["quantization_config"] = quant;
  std::ofstream(dir / "config.json") << cfg.dump();
  const registry::ModelEntry* m = shipped().find_by_name("qwen3-30b-synthetic");
  REQUIRE(m != nullptr);
  registry::ModelEntry e = *m;
  e.checkpoint = dir.path();
  return e;
}

const json k_fp8 = {{"quant_method", "fp8"}, {"fmt", "e4m3"}, {"weight_block_size", {128, 128}}};

}  // namespace

TEST_CASE("the shipped BF16 entry: its offload is its experts' bytes; the hot cache fits its util") {
  TempDir dir;
  FakeReadings fr;
  fr.total = 140.4;
  const Report r = run_preflight(shipped(), synthetic(dir, json()), fr, 0);
  INFO(r.table());
  const CheckResult* e = find(r, "expert_bytes");
  REQUIRE(e);
  CHECK(e->verdict == Verdict::pass);
  CHECK(e->reading == "48 MoE layers x 128 experts x 9.00 MiB (bf16) = 54.0 GiB");
  const CheckResult* h = find(r, "hot_cache");
  REQUIRE(h);
  CHECK(h->verdict == Verdict::pass);
  CHECK(h->reading == "hot 32 of 128 experts x 48 layers = 13.5 GiB");
  CHECK(has(h->message, "resident 2.9 GiB + hot 13.5 GiB + staging 1.1 GiB + KV 1.5 GiB = 19.0 GiB"));
}

TEST_CASE("an FP8 checkpoint under a BF16 entry's offload warns with both figures") {
  TempDir dir;
  FakeReadings fr;
  const Report r = run_preflight(shipped(), synthetic(dir, k_fp8), fr, 0);
  const CheckResult* e = find(r, "expert_bytes");
  REQUIRE(e);
  INFO(e->message);
  CHECK(e->verdict == Verdict::warn);
  CHECK(e->reading == "48 MoE layers x 128 experts x 4.50 MiB (fp8) = 27.0 GiB");
  CHECK(has(e->message, "cpu_offload_gib 54 GiB is not the checkpoint's 27.0 GiB of fp8 experts (bf16 would be 54.0 GiB)"));
  // the same hot fraction costs half the VRAM
  CHECK(find(r, "hot_cache")->reading == "hot 32 of 128 experts x 48 layers = 6.8 GiB");
}

TEST_CASE("host RAM below the experts refuses; below experts + 30 GiB warns") {
  TempDir dir;
  FakeReadings fr;
  registry::ModelEntry m = synthetic(dir, json());
  m.host_ram_gib = 40;
  Report r = run_preflight(shipped(), m, fr, 0);
  const CheckResult* e = find(r, "expert_bytes");
  REQUIRE(e);
  CHECK(e->verdict == Verdict::refuse);
  CHECK(has(e->message, "host_ram_gib 40 GiB cannot hold the 54.0 GiB of experts the worker pins"));
  m.host_ram_gib = 60;
  r = run_preflight(shipped(), m, fr, 0);
  CHECK(find(r, "expert_bytes")->verdict == Verdict::warn);
  CHECK(has(find(r, "expert_bytes")->message, "host_ram_gib 60 GiB < experts 54.0 GiB + 30 GiB of loader headroom"));
  // The NVFP4 checkpoint's experts fit the same 40 GiB.
  TempDir nv;
  m = synthetic(nv, json{{"quant_method", "modelopt"}, {"quant_algo", "NVFP4"}, {"group_size", 16}});
  m.host_ram_gib = 46;
  m.cpu_offload_gib = 15.2;
  r = run_preflight(shipped(), m, fr, 0);
  INFO(find(r, "expert_bytes")->message);
  CHECK(find(r, "expert_bytes")->verdict == Verdict::pass);
  CHECK(find(r, "expert_bytes")->reading == "48 MoE layers x 128 experts x 2.53 MiB (nvfp4) = 15.2 GiB");
}

TEST_CASE("hot cache: util too small warns with the breakdown; a VRAM budget caps the slots like the backend") {
  TempDir dir;
  FakeReadings fr;
  fr.total = 140.4;
  registry::ModelEntry m = synthetic(dir, json());
  m.util = 0.10;
  Report r = run_preflight(shipped(), m, fr, 0);
  const CheckResult* h = find(r, "hot_cache");
  REQUIRE(h);
  CHECK(h->verdict == Verdict::warn);
  CHECK(has(h->message, "= 19.0 GiB > util 0.1 x 140.4 GiB = 14.0 GiB"));
  m.args.push_back("--vram-budget-gib");
  m.args.push_back("10");
  r = run_preflight(shipped(), m, fr, 0);
  // (10 GiB - 2.87 resident - 1.125 staging - 2) / (48 x 9 MiB) = 9 slots
  CHECK(has(find(r, "hot_cache")->reading, "hot 9 of 128 experts x 48 layers"));
  CHECK(has(find(r, "hot_cache")->reading, "--vram-budget-gib 10 leaves room for 9 (asked 32)"));
  // In FP8 the same budget holds more than twice the experts (the staging ring shrinks too):
  // (10 GiB - 2.87 - 0.56 - 2) / (48 x 4.5 MiB) = 21.
  TempDir f8;
  registry::ModelEntry q = synthetic(f8, k_fp8);
  q.args = m.args;
  r = run_preflight(shipped(), q, fr, 0);
  CHECK(has(find(r, "hot_cache")->reading, "leaves room for 21 (asked 32)"));
}
