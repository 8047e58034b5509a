// Preflight checks with injected readings: every refusal names both numbers it compared.
#include <doctest/doctest.h>

#include <algorithm>
#include <cctype>
#include <limits>
#include <string>

#include "preflight/preflight.hpp"
#include "registry/registry.hpp"
#include "tests/preflight/fake_readings.hpp"

using namespace servedeck;
using namespace servedeck::preflight;
using preflight::testing::FakeReadings;

namespace {

const registry::Registry& shipped() {
  static registry::Registry reg = registry::load_registry(std::string(SERVEDECK_SOURCE_DIR) + "/models.toml");
  return reg;
}

const registry::ModelEntry& entry(const std::string& name) {
  const registry::ModelEntry* m = shipped().find_by_name(name);
  REQUIRE(m != nullptr);
  return *m;
}

const CheckResult* find(const Report& r, const std::string& check) {
  for (const auto& c : r.checks)
    if (c.check == check) return &c;
  return nullptr;
}

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("glm53 on a healthy box: no refusal; KV cap and validated context reported") {
  FakeReadings fr;
  Report r = run_preflight(shipped(), entry("glm53"), fr, 8002);
  INFO(r.table());
  CHECK_FALSE(r.refused());
  const CheckResult* kv = find(r, "kv_cap");
  REQUIRE(kv);
  CHECK(has(kv->reading, "5636096000 B"));
  CHECK(has(kv->limit, "ctx 327680 x 17200 B/token"));
  REQUIRE(find(r, "ctx_validated"));
  CHECK(find(r, "ctx_validated")->verdict == Verdict::pass);
  REQUIRE(find(r, "ctx_prefilled"));
  CHECK(find(r, "ctx_prefilled")->verdict == Verdict::warn);
  CHECK(has(find(r, "ctx_prefilled")->message, "304800"));
  REQUIRE(find(r, "rules"));
  CHECK(find(r, "rules")->verdict == Verdict::pass);
  CHECK(find(r, "vram_fit")->verdict == Verdict::pass);
  CHECK(find(r, "memlock")->verdict == Verdict::pass);
  CHECK(find(r, "hot_profile")->verdict == Verdict::pass);
  CHECK(find(r, "offload_consistency")->verdict == Verdict::pass);
  CHECK(r.launch.argv.size() > 10);
}

TEST_CASE("glm53 without checkpoint, RAM and GPU: every refusal at once") {
  FakeReadings fr;
  fr.no_gpu();
  fr.mem = 70.2;
  fr.all_paths = false;  // nothing exists: checkpoint, venv interpreter, hot profile
  Report r = run_preflight(shipped(), entry("glm53"), fr, 8002);
  std::string all = r.refusals();
  INFO(r.table());
  CHECK(r.refused());
  const auto& glm = entry("glm53");
  CHECK(has(all, "checkpoint " + glm.checkpoint + " does not exist"));
  CHECK(has(all, "host_ram: MemAvailable 70.2 GiB < host_ram_gib 155 GiB (cpu_offload_gib 125 + 30)"));
  CHECK(has(all, "gpu: no GPU: libnvidia-ml.so.1 could not be loaded"));
  CHECK(has(all, "engine vllm needs GPU 0"));
  CHECK(has(all, "venv interpreter " + glm.program + " is missing"));
  const CheckResult* hp = find(r, "hot_profile");
  REQUIRE(hp);
  CHECK(hp->verdict == Verdict::warn);
  CHECK(has(hp->message, "~11-14 tok/s"));
  // The table and JSON carry all of it.
  CHECK(has(r.table(), "REFUSED"));
  auto j = r.to_json();
  CHECK(j["refused"] == true);
  CHECK(j["model"] == "glm53");
  CHECK(j["launch"]["env"]["CPU_OFFLOAD_GB"] == "125");
  int refusals = 0;
  for (const auto& c : j["checks"])
    if (c["verdict"] == "refuse") ++refusals;
  CHECK(refusals >= 4);
}

TEST_CASE("tiny (native worker) passes on a CPU-only machine") {
  FakeReadings fr;
  fr.no_gpu();
  fr.mem = 4;
  Report r = run_preflight(shipped(), entry("tiny"), fr, 0);
  INFO(r.table());
  CHECK_FALSE(r.refused());
  REQUIRE(find(r, "gpu"));
  CHECK(find(r, "gpu")->verdict == Verdict::pass);
  CHECK(has(find(r, "gpu")->message, "does not need one"));
  CHECK(find(r, "vram_fit") == nullptr);
}

TEST_CASE("program: a bare name is searched in PATH") {
  FakeReadings fr;
  fr.no_gpu();
  fr.all_paths = false;
  const auto& tiny = entry("tiny");
  fr.paths.insert(tiny.checkpoint);
  Report missing = run_preflight(shipped(), tiny, fr, 0);
  REQUIRE(find(missing, "program"));
  CHECK(find(missing, "program")->verdict == Verdict::refuse);
  CHECK(has(find(missing, "program")->message, "servedeck-worker not found in PATH"));
  // Put it in the first PATH directory.
  std::string path = std::getenv("PATH") ? std::getenv("PATH") : "";
  std::string first = path.substr(0, path.find(':'));
  fr.paths.insert(first + "/servedeck-worker");
  Report found = run_preflight(shipped(), tiny, fr, 0);
  CHECK(find(found, "program")->verdict == Verdict::pass);
  CHECK(find(found, "program")->reading == first + "/servedeck-worker");
}

TEST_CASE("VRAM fit refuses naming every holder, with both numbers") {
  FakeReadings fr;
  fr.used = 60.0;
  fr.procs = {{4242, "python3", 58000}, {777, "Xorg", 1024}};
  Report r = run_preflight(shipped(), entry("glm53"), fr, 8002);
  const CheckResult* v = find(r, "vram_fit");
  REQUIRE(v);
  CHECK(v->verdict == Verdict::refuse);
  INFO(v->message);
  CHECK(has(v->message, "35.6 GiB free"));
  CHECK(has(v->message, "util 0.95 x 95.6 GiB = 90.8 GiB"));
  CHECK(has(v->message, "pid 4242 python3 (58000 MiB)"));
  CHECK(has(v->message, "pid 777 Xorg (1024 MiB)"));
  // glm53 pins host memory: the other CUDA processes are refused too.
  const CheckResult* p = find(r, "cuda_processes");
  REQUIRE(p);
  CHECK(p->verdict == Verdict::refuse);
  CHECK(has(p->message, "2 CUDA process(es) on GPU 0 > 0 allowed"));
  CHECK(has(p->message, "pid 4242 python3"));
}

TEST_CASE("context beyond validated_ctx and model_max_ctx is refused, never clamped") {
  FakeReadings fr;
  registry::ModelEntry m = entry("glm53");
  m.ctx = 400000;
  Report r = run_preflight(shipped(), m, fr, 8002);
  const CheckResult* v = find(r, "ctx_validated");
  REQUIRE(v);
  CHECK(v->verdict == Verdict::refuse);
  CHECK(has(v->message, "ctx 400000 > validated_ctx 327680"));
  CHECK(has(v->message, "not clamped"));
  // Rendered as asked: preflight refuses, it does not rewrite the launch.
  auto it = std::find(r.launch.argv.begin(), r.launch.argv.end(), "--max-model-len");
  REQUIRE(it + 1 < r.launch.argv.end());
  CHECK(*(it + 1) == "400000");
  m.ctx = 2000000;
  m.validated_ctx = 3000000;
  Report r2 = run_preflight(shipped(), m, fr, 8002);
  const CheckResult* mx = find(r2, "ctx_model_max");
  REQUIRE(mx);
  CHECK(mx->verdict == Verdict::refuse);
  CHECK(has(mx->message, "ctx 2000000 > model_max_ctx 1048576"));
}

TEST_CASE("/dev/shm, ptrace_scope: flashnext") {
  FakeReadings fr;
  fr.shm = 20.0;
  fr.ptrace = 1;
  Report r = run_preflight(shipped(), entry("flashnext"), fr, 8003);
  const CheckResult* s = find(r, "shm");
  REQUIRE(s);
  CHECK(s->verdict == Verdict::refuse);
  CHECK(has(s->message, "/dev/shm free 20.0 GiB < shm_gib 40 GiB"));
  const CheckResult* p = find(r, "ptrace_scope");
  REQUIRE(p);
  CHECK(p->verdict == Verdict::refuse);
  CHECK(has(p->message, "ptrace_scope = 1 > 0 required"));
  fr.shm = 50;
  fr.ptrace = 0;
  Report ok = run_preflight(shipped(), entry("flashnext"), fr, 8003);
  CHECK(find(ok, "shm")->verdict == Verdict::pass);
  CHECK(find(ok, "ptrace_scope")->verdict == Verdict::pass);
}

TEST_CASE("RLIMIT_MEMLOCK below the offload warns with both numbers") {
  FakeReadings fr;
  fr.memlock = 8.0 / 1024;  // 8 MiB: systemd's default
  Report r = run_preflight(shipped(), entry("glm53"), fr, 8002);
  const CheckResult* m = find(r, "memlock");
  REQUIRE(m);
  CHECK(m->verdict == Verdict::warn);
  CHECK(has(m->message, "RLIMIT_MEMLOCK 8 MiB < cpu_offload_gib 125 GiB"));
  CHECK_FALSE(r.refused());
  fr.memlock = 200;
  CHECK(find(run_preflight(shipped(), entry("glm53"), fr, 8002), "memlock")->verdict == Verdict::pass);
}

TEST_CASE("hot-expert profile captured at another offload warns with the measured cost") {
  FakeReadings fr;
  registry::ModelEntry m = entry("glm53");
  m.hot_profile_offload_gib = 127;
  Report r = run_preflight(shipped(), m, fr, 8002);
  const CheckResult* h = find(r, "hot_profile");
  REQUIRE(h);
  CHECK(h->verdict == Verdict::warn);
  CHECK(has(h->message, "offload 127 GiB != launch offload 125 GiB"));
  CHECK(has(h->message, "15.09 vs 16.76"));
}

TEST_CASE("offload consistency: CPU_OFFLOAD_GB vs --cpu-offload-gb vs host_ram_gib") {
  FakeReadings fr;
  registry::ModelEntry m = entry("glm53");
  m.env["CPU_OFFLOAD_GB"] = "120";
  m.host_ram_gib = 140;
  Report r = run_preflight(shipped(), m, fr, 8002);
  const CheckResult* c = find(r, "offload_consistency");
  REQUIRE(c);
  CHECK(c->verdict == Verdict::refuse);
  INFO(c->message);
  CHECK(has(c->message, "CPU_OFFLOAD_GB=120 != --cpu-offload-gb 125"));
  CHECK(has(c->message, "host_ram_gib 140 < offload 125 + 30 = 155"));
}

TEST_CASE("measured figures: a declaration more than 10% off is flagged") {
  FakeReadings fr;
  MeasuredFigures f;
  f.host_rss_gib = 141;   // steady state at offload 125 (2026-09-02)
  f.peak_vram_gib = 70;   // far below 0.95 x 95.6
  f.load_time_s = 300;
  f.ctx = 327680;
  f.engine_build = "vllm-glm53@abc";
  Report r = run_preflight(shipped(), entry("glm53"), fr, 8002, f);
  const CheckResult* h = find(r, "measured_host_ram");
  REQUIRE(h);
  CHECK(h->verdict == Verdict::pass);  // 155 vs 141: 9.9%
  const CheckResult* v = find(r, "measured_vram");
  REQUIRE(v);
  CHECK(v->verdict == Verdict::warn);
  CHECK(has(v->message, "peak VRAM 70.0 GiB"));
  CHECK(has(v->message, "90.8 GiB"));
  f.host_rss_gib = 100;
  Report r2 = run_preflight(shipped(), entry("glm53"), fr, 8002, f);
  CHECK(find(r2, "measured_host_ram")->verdict == Verdict::warn);
  CHECK(has(find(r2, "measured_host_ram")->message, "host_ram_gib 155 GiB is 55% off the measured peak host RSS 100.0 GiB"));
  CHECK(has(r2.table(), "last measured: peak VRAM 70.0 GiB; peak host RSS 100.0 GiB; load 300 s; ctx 327680"));
  CHECK(r2.to_json()["measured"]["engine_build"] == "vllm-glm53@abc");
}

TEST_CASE("rules run in preflight with the GPU's compute capability") {
  FakeReadings fr;
  registry::ModelEntry m = entry("glm53");
  for (std::size_t i = 0; i + 1 < m.args.size(); ++i)
    if (m.args[i] == "--kernel-config") m.args[i + 1] = R"({"moe_backend":"flashinfer_cutlass"})";
  Report sm120 = run_preflight(shipped(), m, fr, 8002);
  const CheckResult* rule = find(sm120, "rule:nvfp4-cutlass-moe-sm120");
  REQUIRE(rule);
  CHECK(rule->verdict == Verdict::refuse);
  CHECK(has(rule->message, "GPU compute capability = 120"));
  CHECK(has(rule->message, "one token forever"));
  fr.cc = 90;
  Report h200 = run_preflight(shipped(), m, fr, 8002);
  CHECK(find(h200, "rule:nvfp4-cutlass-moe-sm120") == nullptr);
  // A warn-only rule does not refuse.
  registry::ModelEntry e = entry("glm53");
  e.args.push_back("--enforce-eager");
  fr.cc = 120;
  Report eager = run_preflight(shipped(), e, fr, 8002);
  REQUIRE(find(eager, "rule:enforce-eager"));
  CHECK(find(eager, "rule:enforce-eager")->verdict == Verdict::warn);
  CHECK_FALSE(eager.refused());
}

TEST_CASE("table lists every check and the rendered launch") {
  FakeReadings fr;
  Report r = run_preflight(shipped(), entry("glm53"), fr, 8002);
  std::string t = r.table();
  for (const auto& c : r.checks) CHECK(has(t, c.check));
  CHECK(has(t, "launch env:"));
  CHECK(has(t, "VLLM_MOE_HOT_SLOTS=54"));
  CHECK(has(t, "--kv-cache-memory-bytes 5636096000"));
  CHECK(has(t, R"('{"moe_backend":"marlin"}')"));
  CHECK(to_string(Verdict::refuse) == "refuse");
}

TEST_CASE("every refusal's message contains every number of its reading and limit") {
  // Everything wrong at once, on GLM and Flash-Next.
  FakeReadings fr;
  fr.mem = 70.2;
  fr.used = 60.0;
  fr.procs = {{4242, "python3", 58000}};
  fr.shm = 20.0;
  fr.ptrace = 1;
  fr.all_paths = false;
  registry::ModelEntry glm = entry("glm53");
  glm.ctx = 400000;
  glm.validated_ctx = 327680;
  glm.env["CPU_OFFLOAD_GB"] = "120";
  glm.env["VLLM_USE_BREAKABLE_CUDAGRAPH"] = "1";
  registry::ModelEntry fn = entry("flashnext");
  int refusals = 0;
  for (const registry::ModelEntry* m : {&glm, &fn}) {
    Report r = run_preflight(shipped(), *m, fr, 8002);
    for (const auto& c : r.checks) {
      if (c.verdict != Verdict::refuse) continue;
      ++refusals;
      std::vector<std::string> sources = {c.reading};
      if (c.check.rfind("rule:", 0) != 0) sources.push_back(c.limit);  // a rule's limit is its file:line
      for (const auto& src : sources) {
        for (std::size_t i = 0; i < src.size();) {
          if (!std::isdigit(static_cast<unsigned char>(src[i]))) {
            ++i;
            continue;
          }
          std::size_t j = i;
          while (j < src.size() && (std::isdigit(static_cast<unsigned char>(src[j])) || src[j] == '.')) ++j;
          std::string number = src.substr(i, j - i);
          while (!number.empty() && number.back() == '.') number.pop_back();
          INFO(c.check << ": '" << number << "' from '" << src << "' not in: " << c.message);
          CHECK(has(c.message, number));
          i = j;
        }
      }
    }
  }
  CHECK(refusals >= 10);
}

TEST_CASE("stages: declaration_only runs the checks stopping an engine cannot change; the full run holds both") {
  // glm53 with nothing on disk, no GPU and a box whose RAM and VRAM are held by another engine:
  // before the stop only the declaration refusals may show (gpu, checkpoint, program); the RAM
  // and VRAM readings belong to the engine that is about to be stopped.
  FakeReadings fr;
  fr.no_gpu();
  fr.mem = 20;
  fr.all_paths = false;
  Report before = run_preflight(shipped(), entry("glm53"), fr, 8002, std::nullopt, Scope::declaration_only);
  INFO(before.table());
  CHECK(before.refused());
  for (const auto& c : before.checks) {
    INFO(c.check);
    CHECK(c.stage == Stage::declaration);
  }
  for (const char* name : {"gpu", "checkpoint", "program", "ctx_validated", "ctx_model_max", "kv_cap", "rules"})
    CHECK_MESSAGE(find(before, name) != nullptr, name);
  CHECK(find(before, "gpu")->verdict == Verdict::refuse);
  CHECK(find(before, "checkpoint")->verdict == Verdict::refuse);
  CHECK(find(before, "program")->verdict == Verdict::refuse);
  for (const char* name : {"host_ram", "shm", "vram_fit", "cuda_processes"})
    CHECK_MESSAGE(find(before, name) == nullptr, name);

  Report full = run_preflight(shipped(), entry("glm53"), fr, 8002);
  REQUIRE(find(full, "host_ram"));
  CHECK(find(full, "host_ram")->verdict == Verdict::refuse);
  CHECK(find(full, "host_ram")->stage == Stage::machine);
  CHECK(find(full, "program")->stage == Stage::declaration);
  // The declaration rows of the full run are exactly the declaration-only run's rows.
  Report filtered = declaration_rows(full);
  REQUIRE(filtered.checks.size() == before.checks.size());
  for (std::size_t i = 0; i < before.checks.size(); ++i) {
    CHECK(filtered.checks[i].check == before.checks[i].check);
    CHECK(filtered.checks[i].verdict == before.checks[i].verdict);
  }
  CHECK(full.to_json()["checks"][0]["stage"] == "declaration");  // "gpu" comes first
}

TEST_CASE("stages: a pinned engine beside another CUDA process refuses only after the stop") {
  FakeReadings fr;
  fr.used = 90;
  fr.procs = {GpuProcess{4242, "python3", 90000}};
  Report before = run_preflight(shipped(), entry("glm53"), fr, 8002, std::nullopt, Scope::declaration_only);
  INFO(before.table());
  CHECK_FALSE(before.refused());
  Report full = run_preflight(shipped(), entry("glm53"), fr, 8002);
  CHECK(full.refused());
  REQUIRE(find(full, "vram_fit"));
  CHECK(find(full, "vram_fit")->verdict == Verdict::refuse);
  CHECK(find(full, "vram_fit")->stage == Stage::machine);
}
