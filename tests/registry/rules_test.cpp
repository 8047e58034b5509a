// [[rules]]: every shipped rule fires on a crafted entry; the shipped entries are clean.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <string>

#include "registry/registry.hpp"
#include "registry/rules.hpp"

using namespace servedeck::registry;

namespace {

const Registry& shipped() {
  static Registry reg = load_registry(std::string(SERVEDECK_SOURCE_DIR) + "/models.toml");
  return reg;
}

void set_arg(ModelEntry& m, const std::string& flag, const std::string& value) {
  auto it = std::find(m.args.begin(), m.args.end(), flag);
  if (it == m.args.end()) {
    m.args.push_back(flag);
    if (!value.empty()) m.args.push_back(value);
  } else if (!value.empty()) {
    *(it + 1) = value;
  }
}

void erase_arg(ModelEntry& m, const std::string& flag, bool has_value) {
  auto it = std::find(m.args.begin(), m.args.end(), flag);
  REQUIRE(it != m.args.end());
  m.args.erase(it, it + (has_value ? 2 : 1));
}

std::vector<RuleHit> hits_for(const ModelEntry& m, std::optional<int> cc = 120) {
  return evaluate_rules(shipped().rules, make_rule_subject(m, shipped().server, cc));
}

std::vector<std::string> ids(const std::vector<RuleHit>& hits) {
  std::vector<std::string> out;
  for (const auto& h : hits) out.push_back(h.rule->id);
  return out;
}

struct Case {
  std::string rule;
  std::string name;
  std::function<void(ModelEntry&)> mutate;
  std::vector<std::string> evidence;  // substrings the message must contain (both numbers compared)
};

std::set<std::string> g_covered;

}  // namespace

TEST_CASE("the shipped entries pass every rule clean, on SM120 and with the GPU unknown") {
  for (const auto& m : shipped().models) {
    INFO(m.name);
    CHECK(ids(hits_for(m, 120)).empty());
    CHECK(ids(hits_for(m, std::nullopt)).empty());
  }
}

TEST_CASE("every shipped rule fires on a crafted GLM entry") {
  const ModelEntry& glm = *shipped().find_by_name("glm53");
  std::vector<Case> cases = {
      {"uva-disabled", "UVA fallback", [](ModelEntry& m) { m.env["VLLM_WEIGHT_OFFLOADING_DISABLE_UVA"] = "1"; },
       {"env VLLM_WEIGHT_OFFLOADING_DISABLE_UVA = 1", "D-state"}},
      {"nvfp4-cutlass-moe-sm120", "flashinfer_cutlass",
       [](ModelEntry& m) { set_arg(m, "--kernel-config", R"({"moe_backend":"flashinfer_cutlass"})"); },
       {"moe_backend = flashinfer_cutlass", "one token forever"}},
      {"nvfp4-cutlass-moe-sm120", "cutlass",
       [](ModelEntry& m) { set_arg(m, "--kernel-config", R"({"moe_backend":"cutlass"})"); },
       {"moe_backend = cutlass", "GPU compute capability = 120"}},
      {"nvfp4-cutlass-moe-sm120", "backend unset (auto picks flashinfer_cutlass)",
       [](ModelEntry& m) { erase_arg(m, "--kernel-config", true); }, {"--kernel-config moe_backend absent"}},
      {"nvfp4-trtllm-cutedsl", "flashinfer_trtllm",
       [](ModelEntry& m) { set_arg(m, "--kernel-config", R"({"moe_backend":"flashinfer_trtllm"})"); },
       {"moe_backend = flashinfer_trtllm"}},
      {"nvfp4-trtllm-cutedsl", "flashinfer_cutedsl",
       [](ModelEntry& m) { set_arg(m, "--kernel-config", R"({"moe_backend":"flashinfer_cutedsl"})"); },
       {"moe_backend = flashinfer_cutedsl"}},
      {"mtp-depth-1", "MTP 1",
       [](ModelEntry& m) { set_arg(m, "--speculative-config", R"({"method":"mtp","num_speculative_tokens":1})"); },
       {"num_speculative_tokens = 1 (== 1)", "illegal memory access"}},
      {"mtp-depth-4", "MTP 4",
       [](ModelEntry& m) { set_arg(m, "--speculative-config", R"({"method":"mtp","num_speculative_tokens":4})"); },
       {"num_speculative_tokens = 4 (== 4)", "DeepGEMM"}},
      {"mtp-depth-5", "MTP 5",
       [](ModelEntry& m) { set_arg(m, "--speculative-config", R"({"method":"mtp","num_speculative_tokens":5})"); },
       {"num_speculative_tokens = 5", "4.27 GiB"}},
      {"batched-tokens-floor", "4096", [](ModelEntry& m) { set_arg(m, "--max-num-batched-tokens", "4096"); },
       {"argv --max-num-batched-tokens = 4096 (< 8192)"}},
      {"breakable-cudagraph", "breakable on", [](ModelEntry& m) { m.env["VLLM_USE_BREAKABLE_CUDAGRAPH"] = "1"; },
       {"env VLLM_USE_BREAKABLE_CUDAGRAPH = 1", "request 2-24"}},
      {"enforce-eager", "eager", [](ModelEntry& m) { set_arg(m, "--enforce-eager", ""); },
       {"argv --enforce-eager = (set)", "11.77 vs 13.53"}},
      {"prefill-groups-off", "groups 0", [](ModelEntry& m) { m.env["VLLM_MOE_PREFILL_GROUPS"] = "0"; },
       {"env VLLM_MOE_PREFILL_GROUPS = 0 (not 1)", "614 vs 1,762"}},
      {"prefill-groups-off", "groups absent", [](ModelEntry& m) { m.env.erase("VLLM_MOE_PREFILL_GROUPS"); },
       {"env VLLM_MOE_PREFILL_GROUPS absent"}},
      {"pinned-allocator-granules", "no host register",
       [](ModelEntry& m) { m.env["PYTORCH_ALLOC_CONF"] = "expandable_segments:True"; },
       {"lacks pinned_use_cuda_host_register:True", "1.85x"}},
      {"python-side-pinning", "python pinning",
       [](ModelEntry& m) { m.env.erase("VLLM_WEIGHT_OFFLOADING_DISABLE_PIN_MEMORY"); },
       {"env VLLM_WEIGHT_OFFLOADING_DISABLE_PIN_MEMORY absent", "1.94x", "1.13x"}},
      {"offload-below-load-floor", "offload 90",
       [](ModelEntry& m) {
         m.cpu_offload_gib = 90;
         m.env["CPU_OFFLOAD_GB"] = "90";
         set_arg(m, "--cpu-offload-gb", "90");
       },
       {"cpu_offload_gib = 90 (< load_floor_offload_gib 100)"}},
      {"offload-below-load-floor", "argv offload 64", [](ModelEntry& m) { set_arg(m, "--cpu-offload-gb", "64"); },
       {"argv --cpu-offload-gb = 64 (< load_floor_offload_gib 100)"}},
      {"kv-cap-uncapped", "no KV cap", [](ModelEntry& m) { erase_arg(m, "--kv-cache-memory-bytes", true); },
       {"argv --kv-cache-memory-bytes absent", "14.5 GiB"}},
      {"kv-cap-by-hand", "KV cap by hand",
       [](ModelEntry& m) { set_arg(m, "--kv-cache-memory-bytes", "5637144576"); },
       {"argv --kv-cache-memory-bytes = 5637144576 (not {kv_cache_bytes})"}},
      {"max-model-len-by-hand", "max-model-len by hand",
       [](ModelEntry& m) { set_arg(m, "--max-model-len", "327680"); },
       {"argv --max-model-len = 327680 (not {ctx})"}},
  };
  for (const auto& c : cases) {
    ModelEntry m = glm;
    c.mutate(m);
    auto hits = hits_for(m, 120);
    auto it = std::find_if(hits.begin(), hits.end(), [&](const RuleHit& h) { return h.rule->id == c.rule; });
    INFO(c.rule << " / " << c.name);
    REQUIRE(it != hits.end());
    std::string msg = it->message();
    INFO(msg);
    for (const auto& e : c.evidence) CHECK(msg.find(e) != std::string::npos);
    g_covered.insert(c.rule);
  }
  for (const auto& r : shipped().rules) {
    INFO("shipped rule without a firing test: " << r.id);
    CHECK(g_covered.count(r.id) == 1);
  }
}

TEST_CASE("GPU-scoped rules: unknown GPU counts as matching and says so; another GPU does not match") {
  ModelEntry m = *shipped().find_by_name("glm53");
  set_arg(m, "--kernel-config", R"({"moe_backend":"cutlass"})");
  auto on_h200 = ids(hits_for(m, 90));
  CHECK(std::find(on_h200.begin(), on_h200.end(), "nvfp4-cutlass-moe-sm120") == on_h200.end());
  auto unknown = hits_for(m, std::nullopt);
  REQUIRE(unknown.size() == 1);
  CHECK(unknown[0].gpu_cc_assumed);
  CHECK(unknown[0].evidence.find("GPU compute capability unknown (rule applies to [120,121])") != std::string::npos);
}

TEST_CASE("lint reports a rule hit with the entry, the rule line and the reason") {
  // A copy of the shipped file with one knob turned: lint names it.
  std::vector<Diagnostic> d;
  Registry reg = parse_registry(R"([models.v]
engine = "vllm"
program = "vllm"
ctx = 100
args = ["--max-num-batched-tokens", "2048", "--enforce-eager"]
cpu_offload_gib = 110
host_ram_gib = 140
[[rules]]
id = "floor"
action = "refuse"
reason = "dies at 4096"
[rules.match]
arg."--max-num-batched-tokens" = { lt = 8192 }
[[rules]]
id = "eager"
action = "warn"
reason = "-13%"
[rules.match]
arg."--enforce-eager" = { present = true }
field.cpu_offload_gib = { ge = 100 }
)",
                                "m.toml", d);
  CHECK(d.empty());
  auto hits = hits_for(reg.models[0]);  // shipped rules also apply
  (void)hits;
  auto own = evaluate_rules(reg.rules, make_rule_subject(reg.models[0], reg.server, std::nullopt));
  REQUIRE(own.size() == 2);
  CHECK(own[0].message() == "argv --max-num-batched-tokens = 2048 (< 8192): dies at 4096");
  CHECK(own[1].message() == "argv --enforce-eager = (set); cpu_offload_gib = 110 (>= 100): -13%");
}

TEST_CASE("rule grammar errors name the line, the key and what is valid") {
  std::vector<Diagnostic> d;
  parse_registry(R"([[rules]]
id = "x"
action = "deny"
reason = "r"
[rules.match]
engin = "vllm"
arg."--a" = { lesser = 3 }
field.cpu_offload = { lt = "nope" }
[[rules]]
id = "x"
action = "warn"
match = { engine = "tpu" }
)",
                 "m.toml", d);
  std::string all;
  for (const auto& x : d) all += x.to_string() + "\n";
  INFO(all);
  CHECK(all.find("m.toml:3: error: rules.x.action = \"deny\" is not valid; valid: refuse, warn") != std::string::npos);
  CHECK(all.find("m.toml:6: error: rules.x.match.engin: unknown match key 'engin'; did you mean 'engine'?") != std::string::npos);
  CHECK(all.find("m.toml:7: error: rules.x.match.arg.--a.lesser: unknown operator 'lesser'") != std::string::npos);
  CHECK(all.find("unknown field 'cpu_offload'; did you mean 'cpu_offload_gib'?") != std::string::npos);
  CHECK(all.find("'lt' takes a number or a numeric entry field name; 'nope' is not a field") != std::string::npos);
  CHECK(all.find("rules.x.reason is missing") != std::string::npos);
  CHECK(all.find("engine \"tpu\" is not one of native, vllm, llama.cpp, command") != std::string::npos);
  CHECK(all.find("rules.id = \"x\" is used twice (first at line 1)") != std::string::npos);
}

TEST_CASE("arg_value forms") {
  std::vector<std::string> a = {"--x", "1", "--flag", "--y=2", "--x", "3", "--last"};
  CHECK(arg_value(a, "--x") == "3");
  CHECK(arg_value(a, "--y") == "2");
  CHECK(arg_value(a, "--flag") == "");
  CHECK(arg_value(a, "--last") == "");
  CHECK_FALSE(arg_value(a, "--z").has_value());
}

TEST_CASE("lint: a refusal that depends on the GPU is a warning; an unconditional one is an error") {
  std::string text = R"([models.v]
engine = "vllm"
program = "vllm"
ctx = 100
args = ["--kernel-config", '{"moe_backend":"cutlass"}', "--speculative-config", '{"method":"mtp","num_speculative_tokens":1}']
[[rules]]
id = "cutlass"
action = "refuse"
reason = "one token forever"
[rules.match]
gpu_cc = [120]
arg."--kernel-config" = { json = "moe_backend", equals = "cutlass" }
[[rules]]
id = "mtp1"
action = "refuse"
reason = "dies"
[rules.match]
arg."--speculative-config" = { json = "num_speculative_tokens", eq = 1 }
)";
  std::string dir = (std::filesystem::temp_directory_path() / "servedeck-rules-XXXXXX").string();
  REQUIRE(::mkdtemp(dir.data()) != nullptr);
  std::string path = dir + "/models.toml";
  {
    std::ofstream out(path);
    out << text;
  }
  auto d = lint_registry(path);
  std::filesystem::remove_all(dir);
  REQUIRE(d.size() == 2);
  CHECK(d[0].severity == "error");
  CHECK(d[0].message.find("rule mtp1 (refuse, rule at line 13)") != std::string::npos);
  CHECK(d[0].location.line == 1);
  CHECK(d[1].severity == "warning");
  CHECK(d[1].message.find("rule cutlass (refuse on a matching GPU; preflight decides") != std::string::npos);
  CHECK(d[1].message.find("GPU compute capability unknown (rule applies to [120])") != std::string::npos);
}
