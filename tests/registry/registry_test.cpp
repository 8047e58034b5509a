// models.toml parsing, validation, discovery and rendering.
#include <doctest/doctest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "registry/discovery.hpp"
#include "registry/registry.hpp"

namespace fs = std::filesystem;
using namespace servedeck::registry;

namespace {

std::string shipped() { return std::string(SERVEDECK_SOURCE_DIR) + "/models.toml"; }

struct TempDir {
  fs::path path;
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "servedeck-registry-XXXXXX").string();
    char* p = ::mkdtemp(tmpl.data());
    REQUIRE(p != nullptr);
    path = p;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  fs::path write(const std::string& name, const std::string& text) const {
    fs::path p = path / name;
    fs::create_directories(p.parent_path());
    std::ofstream(p) << text;
    return p;
  }
};

std::vector<Diagnostic> diagnose(const std::string& text, const std::string& path = "models.toml") {
  std::vector<Diagnostic> d;
  parse_registry(text, path, d);
  return d;
}

std::string all_text(const std::vector<Diagnostic>& d) {
  std::string out;
  for (const auto& x : d) out += x.to_string() + "\n";
  return out;
}

const char* kMinimal = R"([models.m]
engine = "native"
program = "servedeck-worker"
ctx = 1024
)";

}  // namespace

TEST_CASE("shipped models.toml: lint reports nothing") {
  auto d = lint_registry(shipped());
  INFO(all_text(d));
  CHECK(d.empty());
}

TEST_CASE("shipped models.toml: GLM entry transcribed with derived KV cap") {
  Registry reg = load_registry(shipped());
  const ModelEntry* glm = reg.find_by_name("glm53");
  REQUIRE(glm != nullptr);
  CHECK(glm->engine == EngineKind::vllm);
  CHECK(glm->served_name == "glm53-flash");
  CHECK(glm->ctx == 327680);
  CHECK(glm->validated_ctx == 327680);
  CHECK(glm->prefilled_ctx == 304800);
  CHECK(glm->model_max_ctx == 1048576);
  CHECK(glm->kv_cache_bytes_per_token == 17200);
  CHECK(glm->kv_cache_bytes() == 5636096000LL);
  CHECK(glm->util == doctest::Approx(0.95));
  CHECK(glm->cpu_offload_gib == 125);
  CHECK(glm->host_ram_gib == 155);
  CHECK(glm->pins_host_memory);
  CHECK(glm->needs_gpu());
  CHECK(glm->env.at("CPU_OFFLOAD_GB") == "125");
  CHECK(glm->env.at("VLLM_MOE_HOT_SLOTS") == "54");
  CHECK(glm->policies.min_output_tokens == 8192);
  CHECK(glm->policies.sanitize_tool_tags);
  CHECK_FALSE(glm->policies.restore_reasoning);
  CHECK(glm->policies.mirror_content);
  CHECK_FALSE(glm->policies.capture);
  REQUIRE(glm->presets.size() == 3);
  CHECK(reg.find_by_id("glm53-flash-high") == glm);
  REQUIRE(reg.find_preset("glm53-flash-low") != nullptr);
  CHECK(reg.find_preset("glm53-flash-low")->chat_template_kwargs["reasoning_effort"] == "low");
  CHECK(reg.find_preset("glm53-flash") == nullptr);

  LaunchSpec spec = render_launch(*glm, 8002, reg.server);
  auto after = [&](const std::string& flag) {
    for (std::size_t i = 0; i + 1 < spec.argv.size(); ++i)
      if (spec.argv[i] == flag) return spec.argv[i + 1];
    return std::string("<absent>");
  };
  CHECK(after("--kv-cache-memory-bytes") == "5636096000");
  CHECK(after("--max-model-len") == "327680");
  CHECK(after("--gpu-memory-utilization") == "0.95");
  CHECK(after("--port") == "8002");
  CHECK(after("--served-model-name") == "glm53-flash");
  CHECK(after("--kernel-config") == R"({"moe_backend":"marlin"})");
  CHECK(spec.env.at("VLLM_MOE_HOT_PROFILE") == glm->hot_profile);
  CHECK(spec.env.at("CUDA_VISIBLE_DEVICES") == "0");
  CHECK(spec.argv[0] == glm->program);
}

TEST_CASE("shipped models.toml: server, tiny and relative paths") {
  Registry reg = load_registry(shipped());
  CHECK(reg.server.listen_host == "127.0.0.1");
  CHECK(reg.server.listen_port == 8090);
  CHECK(reg.server.default_model == "tiny");
  CHECK(reg.server.state_dir == (fs::path(SERVEDECK_SOURCE_DIR) / ".servedeck-state").lexically_normal().string());
  const ModelEntry* tiny = reg.find_by_name("tiny");
  REQUIRE(tiny);
  CHECK(tiny->engine == EngineKind::native);
  CHECK_FALSE(tiny->needs_gpu());
  CHECK(tiny->program == "servedeck-worker");
  CHECK(tiny->checkpoint == (fs::path(SERVEDECK_SOURCE_DIR) / "models/tiny").lexically_normal().string());
  CHECK(tiny->kv_cache_bytes() == 16384 * 256);
  LaunchSpec spec = render_launch(*tiny, 41234, reg.server);
  REQUIRE(spec.argv.size() == 16);
  CHECK(spec.argv[1] == "serve");
  CHECK(spec.argv[3] == tiny->checkpoint);
  CHECK(spec.argv[7] == "41234");
  CHECK(spec.argv[13] == "4194304");
  CHECK(spec.argv[14] == "--default-max-tokens");
  CHECK(spec.argv[15] == "128");
  const ModelEntry* fn = reg.find_by_name("flashnext");
  REQUIRE(fn);
  CHECK(fn->uses_cuda_ipc);
  CHECK(fn->shm_gib == 40);
  const ModelEntry* ll = reg.find_by_name("llama-example");
  REQUIRE(ll);
  CHECK(ll->engine == EngineKind::llama_cpp);
  CHECK(ll->needs_gpu());  // -ngl 99
}

TEST_CASE("defaults of an entry") {
  Registry reg = parse_registry(kMinimal, "/tmp/x/models.toml");
  REQUIRE(reg.models.size() == 1);
  const ModelEntry& m = reg.models[0];
  CHECK(m.served_name == "m");
  CHECK(m.host == "127.0.0.1");
  CHECK(m.port == 0);
  CHECK(m.health_path == "/health");
  CHECK(m.start_timeout_s == 600);
  CHECK(m.stop_timeout_s == 30);
  CHECK(m.request_timeout_s == 1800);
  CHECK_FALSE(m.kv_cache_bytes().has_value());
  CHECK(m.location.line == 1);
  CHECK(reg.server.listen_port == 8090);
  CHECK(reg.server.state_dir == "/var/lib/servedeck");
}

TEST_CASE("a typo'd key names its line and suggests the right key") {
  std::string text = std::string(kMinimal) + "validated_cxt = 2048\n";
  auto d = diagnose(text);
  REQUIRE(d.size() == 1);
  CHECK(d[0].severity == "error");
  CHECK(d[0].location.line == 5);
  CHECK(d[0].key == "models.m.validated_cxt");
  CHECK(d[0].to_string().find("models.toml:5:") == 0);
  CHECK(d[0].message.find("did you mean 'validated_ctx'?") != std::string::npos);
  CHECK(d[0].message.find("2048") != std::string::npos);
  CHECK_THROWS_AS(parse_registry(text, "models.toml"), RegistryError);
}

TEST_CASE("lint on a file with a typo'd key names the line") {
  TempDir dir;
  fs::path p = dir.write("models.toml", std::string(kMinimal) + "\n[models.m.policies]\nsanitise_tool_tags = true\n");
  auto d = lint_registry(p.string());
  REQUIRE(d.size() == 1);
  CHECK(d[0].location.line == 7);
  CHECK(d[0].message.find("sanitize_tool_tags") != std::string::npos);
}

TEST_CASE("all errors are collected, each naming key, value and what is valid") {
  std::string text = R"([server]
listen = "localhost"
[models.a]
engine = "vlm"
program = "x"
ctx = 400000
validated_ctx = 327680
util = 1.5
port = "8000"
cpu_offload_gib = 125
host_ram_gib = 100
args = ["--cpu-offload-gb", "120", "--foo", "{prot}"]
env = { CPU_OFFLOAD_GB = "125" }
)";
  auto d = diagnose(text);
  std::string all = all_text(d);
  INFO(all);
  CHECK(all.find("models.toml:2: error: server.listen = \"localhost\" is not HOST:PORT") != std::string::npos);
  CHECK(all.find("models.toml:4: error: models.a.engine = \"vlm\" is not an engine; valid: native, vllm") != std::string::npos);
  CHECK(all.find("models.toml:6: error: models.a.ctx = 400000 exceeds validated_ctx = 327680") != std::string::npos);
  CHECK(all.find("models.toml:8: error: models.a.util = 1.5 is out of range") != std::string::npos);
  CHECK(all.find("models.toml:9: error: models.a.port = \"8000\" has the wrong type; expected an integer") != std::string::npos);
  CHECK(all.find("models.toml:11: error: models.a.host_ram_gib = 100 is below cpu_offload_gib 125 + 30 = 155") != std::string::npos);
  CHECK(all.find("unknown placeholder {prot}; did you mean {port}?") != std::string::npos);
  CHECK(all.find("models.a.env.CPU_OFFLOAD_GB = \"125\" differs from argv --cpu-offload-gb 120") != std::string::npos);
  CHECK(all.find("--cpu-offload-gb 120 differs from cpu_offload_gib = 125") != std::string::npos);
  CHECK(d.size() == 9);
}

TEST_CASE("missing required keys and a placeholder without its source") {
  auto d = diagnose("[models.a]\nargs = [\"{kv_cache_bytes}\", \"{util}\"]\n");
  std::string all = all_text(d);
  INFO(all);
  CHECK(all.find("models.a.engine is missing") != std::string::npos);
  CHECK(all.find("models.a.program is missing") != std::string::npos);
  CHECK(all.find("models.a.ctx is missing") != std::string::npos);
  CHECK(all.find("uses {kv_cache_bytes} but models.a.kv_cache_bytes_per_token is not set") != std::string::npos);
  CHECK(all.find("uses {util} but models.a.util is not set") != std::string::npos);
}

TEST_CASE("duplicate ids and colliding preset aliases") {
  std::string text = R"([models.a]
engine = "native"
program = "w"
ctx = 10
served_name = "one"
aliases = ["two"]
[[models.a.presets]]
alias = "one-low"
chat_template_kwargs = { reasoning_effort = "low" }
[models.b]
engine = "native"
program = "w"
ctx = 10
served_name = "two"
[[models.b.presets]]
alias = "one-low"
)";
  auto d = diagnose(text);
  std::string all = all_text(d);
  INFO(all);
  REQUIRE(d.size() == 2);
  CHECK(all.find("models.toml:14: error: models.b.served_name = \"two\" collides: id already used as models.a.aliases[0] (line 6)") != std::string::npos);
  CHECK(all.find("models.toml:16: error: models.b.presets[0].alias = \"one-low\" collides: preset alias already used as models.a.presets[0].alias (line 8)") != std::string::npos);
}

TEST_CASE("preset effort outside accepted_reasoning_efforts; default_model unknown") {
  std::string text = R"([server]
default_model = "nope"
[models.a]
engine = "native"
program = "w"
ctx = 10
[[models.a.presets]]
alias = "a-xhigh"
chat_template_kwargs = { reasoning_effort = "xhigh" }
[models.a.policies]
accepted_reasoning_efforts = ["low", "high", "max"]
)";
  auto d = diagnose(text);
  std::string all = all_text(d);
  INFO(all);
  CHECK(d.size() == 2);
  CHECK(all.find("models.toml:2: error: server.default_model") != std::string::npos);
  CHECK(all.find("reasoning_effort = \"xhigh\" is not in policies.accepted_reasoning_efforts; valid: low, high, max") != std::string::npos);
  CHECK(all.find("server.default_model = \"nope\" names no model; valid: a") != std::string::npos);
}

TEST_CASE("TOML syntax errors carry the line") {
  auto d = diagnose("[models.a]\nengine = \n");
  REQUIRE(d.size() == 1);
  CHECK(d[0].location.line == 2);
  CHECK(d[0].message.find("TOML syntax") == 0);
}

TEST_CASE("load_registry: missing file is an error naming the path") {
  try {
    load_registry("/nonexistent/servedeck/models.toml");
    FAIL("expected RegistryError");
  } catch (const RegistryError& e) {
    REQUIRE(e.diagnostics.size() == 1);
    CHECK(e.diagnostics[0].message.find("/nonexistent/servedeck/models.toml") != std::string::npos);
  }
}

TEST_CASE("lint: /dev/zero and a directory are refused at once with what was read") {
  const auto zero = lint_registry("/dev/zero");  // endless: must stop at the size cap
  REQUIRE(zero.size() == 1);
  CHECK(zero[0].severity == "error");
  CHECK(zero[0].message.find("/dev/zero: more than 4 MiB read") != std::string::npos);
  const auto dir = lint_registry("/tmp");
  REQUIRE(dir.size() == 1);
  CHECK(dir[0].message.find("/tmp: is a directory") != std::string::npos);
}

TEST_CASE("model_max_ctx discovery: top level and through text_config") {
  TempDir dir;
  dir.write("flat/config.json", R"({"max_position_embeddings": 4096})");
  dir.write("nested/config.json", R"({"architectures":["X"],"text_config":{"max_position_embeddings": 1048576}})");
  dir.write("broken/config.json", "{not json");
  auto flat = discover_model_max_ctx((dir.path / "flat").string());
  CHECK(flat.max_ctx == 4096);
  auto nested = discover_model_max_ctx((dir.path / "nested").string());
  CHECK(nested.max_ctx == 1048576);
  CHECK(nested.source == "config.json text_config.max_position_embeddings");
  auto none = discover_model_max_ctx((dir.path / "absent").string());
  CHECK_FALSE(none.max_ctx);
  CHECK(none.error.empty());
  auto broken = discover_model_max_ctx((dir.path / "broken").string());
  CHECK_FALSE(broken.max_ctx);
  CHECK(broken.error.find("not a JSON object") != std::string::npos);

  // Through the registry: relative checkpoint, discovered limit, and a ctx above it refused.
  fs::path cfg = dir.write("models.toml", R"([models.n]
engine = "native"
program = "w"
checkpoint = "nested"
ctx = 2000000
)");
  std::vector<Diagnostic> d;
  std::ifstream in(cfg);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  Registry reg = parse_registry(text, cfg.string(), d);
  REQUIRE(reg.models.size() == 1);
  CHECK(reg.models[0].model_max_ctx == 1048576);
  CHECK(reg.models[0].model_max_ctx_discovered);
  REQUIRE(d.size() == 1);
  CHECK(d[0].message.find("ctx = 2000000 exceeds model_max_ctx = 1048576 (discovered from") != std::string::npos);
}

TEST_CASE("render_launch fills every placeholder") {
  Registry reg = parse_registry(R"([server]
state_dir = "/srv/sd"
[models.p]
engine = "command"
program = "/bin/engine"
host = "127.0.0.2"
gpu = 1
ctx = 1000
kv_cache_bytes_per_token = 3
util = 0.5
cpu_offload_gib = 2.5
host_ram_gib = 40
hot_profile = "/p.json"
served_name = "sv"
args = ["{port}", "{host}", "{ctx}", "{model}", "{served_name}", "{gpu}", "{kv_cache_bytes}", "{util}",
        "{cpu_offload_gib}", "{name}", "{state_dir}", "{hot_profile}", "{config_dir}", '{"a":{"b":1}}', "x{ctx}y"]
env = { A = "{ctx}", CUDA_VISIBLE_DEVICES = "3" }
)",
                                "/etc/sd/models.toml");
  LaunchSpec s = render_launch(reg.models[0], 9000, reg.server);
  std::vector<std::string> want = {"/bin/engine", "9000", "127.0.0.2", "1000", "", "sv", "1", "3000", "0.5", "2.5",
                                   "p", "/srv/sd", "/p.json", "/etc/sd", R"({"a":{"b":1}})", "x1000y"};
  CHECK(s.argv == want);
  CHECK(s.env.at("A") == "1000");
  CHECK(s.env.at("CUDA_VISIBLE_DEVICES") == "3");  // the registry's value wins
  CHECK(s.port == 9000);
  CHECK(s.host == "127.0.0.2");
}

TEST_CASE("resolve_config_path and resolve_program") {
  CHECK(resolve_config_path("models/tiny", "/etc/sd") == "/etc/sd/models/tiny");
  CHECK(resolve_config_path("../x", "/etc/sd") == "/etc/x");
  CHECK(resolve_config_path("/abs", "/etc/sd") == "/abs");
  const char* home = std::getenv("HOME");
  if (home) CHECK(resolve_config_path("~/m", "/etc") == (fs::path(home) / "m").lexically_normal().string());
  CHECK(resolve_program("sh").find("/sh") != std::string::npos);
  CHECK(resolve_program("servedeck-no-such-program-xyz").empty());
  CHECK(resolve_program("./rel/path") == "./rel/path");
}

TEST_CASE("top-level typos and wrong table types") {
  auto d = diagnose("[modles.a]\nengine = \"native\"\n[server]\nlisten = \"127.0.0.1:0\"\nstate = \"x\"\n");
  std::string all = all_text(d);
  INFO(all);
  REQUIRE(d.size() == 2);
  CHECK(all.find("models.toml:1: error: unknown key modles = {...}; did you mean 'models'?") != std::string::npos);
  CHECK(all.find("models.toml:5: error: unknown key server.state = \"x\"; did you mean 'state_dir'?") != std::string::npos);
  auto d2 = diagnose("models = { a = 5 }\nrules = 3\n");
  std::string all2 = all_text(d2);
  INFO(all2);
  CHECK(all2.find("models.a = 5 has the wrong type; expected a table [models.a]") != std::string::npos);
  CHECK(all2.find("rules = 3 has the wrong type; expected an array") != std::string::npos);
}

TEST_CASE("a model name that would leave state_dir, or is not one, is refused with what was read") {
  // {name} fills paths such as {state_dir}/hot-profiles/{name}.json and the API's model field.
  auto d = diagnose("[models.\"../../etc/x\"]\nengine = \"native\"\n[models.\"a b\"]\nengine = \"native\"\n"
                    "[models.\".hidden\"]\nengine = \"native\"\n[models.\"l\\n2\"]\nengine = \"native\"\n");
  const std::string all = all_text(d);
  INFO(all);
  CHECK(all.find("models.toml:1: error: [models.\"../../etc/x\"]: a model name is 1 to 64 letters, digits, '.', '_' or '-'") !=
        std::string::npos);
  CHECK(all.find("[models.\"a b\"]: a model name") != std::string::npos);
  CHECK(all.find("[models.\".hidden\"]: a model name") != std::string::npos);
  CHECK(all.find("[models.\"l\\n2\"]: a model name") != std::string::npos);  // the newline escaped, not printed
  CHECK(valid_model_name("glm45-air-nvfp4"));
  CHECK(valid_model_name("Qwen3.5_coder"));
  CHECK_FALSE(valid_model_name(""));
  CHECK_FALSE(valid_model_name(std::string(65, 'a')));
  CHECK(valid_model_name(std::string(64, 'a')));
  CHECK_FALSE(valid_model_name("-x"));
  CHECK_FALSE(valid_model_name("a/b"));
}

TEST_CASE("Diagnostic::to_string without a line") {
  Diagnostic d{"error", SourceLocation{"m.toml", 0, 0}, "k", "m.toml: cannot be read (no such file)"};
  CHECK(d.to_string() == "m.toml: error: m.toml: cannot be read (no such file)");
}

TEST_CASE("[server] access and retention keys: defaults, values, and errors naming what is valid") {
  Registry def = parse_registry(kMinimal, "/tmp/x/models.toml");
  CHECK(def.server.allowed_hosts.empty());
  CHECK(def.server.responses_retention_s == 7 * 24 * 3600);
  CHECK(def.server.history_retention_s == 30 * 24 * 3600);
  CHECK(def.server.history_max_rows == 100000);

  Registry reg = parse_registry(std::string("[server]\nallowed_hosts = [\"Workstation.LAN\", \"192.168.1.5\", \"fe80::1\"]\n"
                                            "responses_retention_s = 0\nhistory_retention_s = 3600\n"
                                            "history_max_rows = 500\n") + kMinimal,
                                "/tmp/x/models.toml");
  CHECK(reg.server.allowed_hosts == std::vector<std::string>{"workstation.lan", "192.168.1.5", "fe80::1"});
  CHECK(reg.server.responses_retention_s == 0);
  CHECK(reg.server.history_retention_s == 3600);
  CHECK(reg.server.history_max_rows == 500);

  auto d = diagnose(std::string("[server]\nallowed_hosts = [\"http://evil.example:80\", \"ok.lan\"]\n"
                                "responses_retention_s = -1\nhistory_retention_s = 1\nhistory_max_rows = 5\n") + kMinimal);
  std::string all = all_text(d);
  INFO(all);
  CHECK(all.find("models.toml:2: error: server.allowed_hosts[0] = \"http://evil.example:80\" is not a host name") !=
        std::string::npos);
  CHECK(all.find("server.allowed_hosts[1]") == std::string::npos);
  CHECK(all.find("models.toml:3: error: server.responses_retention_s = -1") != std::string::npos);
  CHECK(all.find("models.toml:4: error: server.history_retention_s = 1") != std::string::npos);
  CHECK(all.find("models.toml:5: error: server.history_max_rows = 5") != std::string::npos);
}

TEST_CASE("the Messages bridge's and the budget fit's keys: defaults, settings, and a floor out of range") {
  const ModelEntry d = parse_registry(kMinimal, "/tmp/x/models.toml").models.at(0);
  CHECK(d.policies.fit_output_budget);
  CHECK(d.policies.fit_output_budget_floor == 256);
  CHECK(d.policies.strip_billing_header);
  CHECK_FALSE(d.vision);
  const std::string set = std::string(kMinimal) +
                          "vision = true\n[models.m.policies]\nfit_output_budget = false\nfit_output_budget_floor = 1024\n"
                          "strip_billing_header = false\n";
  const ModelEntry m = parse_registry(set, "/tmp/x/models.toml").models.at(0);
  CHECK(m.vision);
  CHECK_FALSE(m.policies.fit_output_budget);
  CHECK(m.policies.fit_output_budget_floor == 1024);
  CHECK_FALSE(m.policies.strip_billing_header);
  const std::string bad = std::string(kMinimal) + "[models.m.policies]\nfit_output_budget_floor = 0\n";
  CHECK(all_text(diagnose(bad)).find("fit_output_budget_floor") != std::string::npos);
}

TEST_CASE("request_timeout_s: a non-streaming request's deadline, 1 to 86400 s") {
  CHECK(parse_registry(std::string(kMinimal) + "request_timeout_s = 90\n", "/tmp/x/models.toml").models[0].request_timeout_s == 90);
  auto d = diagnose(std::string(kMinimal) + "request_timeout_s = 0\n");
  REQUIRE(d.size() == 1);
  CHECK(d[0].key == "models.m.request_timeout_s");
  CHECK(d[0].message.find("out of range") != std::string::npos);
}
