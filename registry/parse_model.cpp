// Parsing and per-entry validation of one [models.NAME] table.
#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "registry/discovery.hpp"
#include "registry/parse_internal.hpp"
#include "registry/registry.hpp"
#include "registry/rules.hpp"
#include "registry/shm_glob.hpp"

namespace servedeck::registry::detail {

namespace {

constexpr int64_t kMaxTokens = int64_t{1} << 40;
constexpr double kMaxGib = 1 << 20;  // 1 PiB: anything larger is a typo
/// note: host RAM the loader needs beyond the offload: the GLM load peaked near offload + 38 GiB
/// (110 GiB offload, ~168 GiB host use, 2026-08-29) and steadies at offload + ~16 GiB; 30 keeps a
/// ~14 GiB cushion over steady state (seed notes, "Host RAM is a hard precondition").
constexpr double kLoaderTransientGib = 30;

}  // namespace

const std::vector<std::string>& model_keys() {
  static const std::vector<std::string> k = {
      "engine", "served_name", "aliases", "presets", "description", "checkpoint", "program", "args", "env",
      "host", "port", "gpu", "requires_gpu", "ctx", "validated_ctx", "prefilled_ctx", "model_max_ctx",
      "kv_cache_bytes_per_token", "util", "host_ram_gib", "cpu_offload_gib", "shm_gib",
      "load_floor_offload_gib", "pins_host_memory", "uses_cuda_ipc", "hot_profile", "hot_profile_offload_gib",
      "health_path", "start_timeout_s", "stop_timeout_s", "drain_timeout_s", "vram_release_timeout_s",
      "shm_globs", "warmup", "switch_on_request", "queue_max", "queue_timeout_s", "min_residency_s",
      "connect_timeout_ms", "first_byte_timeout_ms", "max_gap_ms", "request_timeout_s", "vision", "restart_on_failure",
      "liveness_interval_s", "liveness_idle_s", "liveness_timeout_s", "policies"};
  return k;
}

const std::vector<std::string>& policy_keys() {
  static const std::vector<std::string> k = {
      "min_output_tokens", "sanitize_tool_tags", "restore_reasoning", "mirror_content", "answer_rescue",
      "flatten_content", "capture", "accepted_reasoning_efforts", "default_reasoning_effort",
      "unsupported_kwargs", "thinking_token_budget", "coerce_tool_argument_types", "fit_output_budget",
      "fit_output_budget_floor", "strip_billing_header", "extra"};
  return k;
}

const std::vector<std::string>& preset_keys() {
  static const std::vector<std::string> k = {"alias", "chat_template_kwargs", "thinking_token_budget"};
  return k;
}

namespace {

PolicyConfig parse_policies(const toml::table& t, const std::string& prefix, DiagnosticSink& sink, KeyLines& lines) {
  TableReader r(t, prefix, sink, policy_keys());
  PolicyConfig p;
  for (const auto& k : policy_keys())
    if (r.has(k)) lines["policies." + k] = r.line(k);
  if (auto v = r.integer("min_output_tokens", 1, kMaxTokens, "tokens")) p.min_output_tokens = *v;
  if (auto v = r.boolean("sanitize_tool_tags")) p.sanitize_tool_tags = *v;
  if (auto v = r.boolean("restore_reasoning")) p.restore_reasoning = *v;
  if (auto v = r.boolean("mirror_content")) p.mirror_content = *v;
  if (auto v = r.boolean("answer_rescue")) p.answer_rescue = *v;
  if (auto v = r.boolean("flatten_content")) p.flatten_content = *v;
  if (auto v = r.boolean("capture")) p.capture = *v;
  if (auto v = r.string_array("accepted_reasoning_efforts")) p.accepted_reasoning_efforts = *v;
  if (auto v = r.string("default_reasoning_effort")) p.default_reasoning_effort = *v;
  if (auto v = r.string_array("unsupported_kwargs")) p.unsupported_kwargs = *v;
  if (auto v = r.boolean("thinking_token_budget")) p.thinking_token_budget = *v;
  if (auto v = r.boolean("coerce_tool_argument_types")) p.coerce_tool_argument_types = *v;
  if (auto v = r.boolean("fit_output_budget")) p.fit_output_budget = *v;
  if (auto v = r.integer("fit_output_budget_floor", 1, kMaxTokens, "tokens")) p.fit_output_budget_floor = *v;
  if (auto v = r.boolean("strip_billing_header")) p.strip_billing_header = *v;
  if (auto e = r.subtable("extra")) p.extra = to_json(*e);
  const auto& acc = p.accepted_reasoning_efforts;
  if (p.default_reasoning_effort && !acc.empty() &&
      std::find(acc.begin(), acc.end(), *p.default_reasoning_effort) == acc.end()) {
    std::string valid;
    for (const auto& a : acc) valid += (valid.empty() ? "" : ", ") + a;
    sink.error(r.line("default_reasoning_effort"), r.key_path("default_reasoning_effort"),
               r.key_path("default_reasoning_effort") + " = \"" + *p.default_reasoning_effort +
                   "\" is not in accepted_reasoning_efforts; valid: " + valid);
  }
  return p;
}

std::vector<EffortPreset> parse_presets(const toml::array& a, const std::string& prefix, DiagnosticSink& sink,
                                        KeyLines& lines) {
  std::vector<EffortPreset> out;
  for (std::size_t i = 0; i < a.size(); ++i) {
    std::string p = prefix + "[" + std::to_string(i) + "]";
    const toml::node& n = *a.get(i);
    auto t = n.as_table();
    if (!t) {
      sink.error(line_of(n), p, p + " = " + show(n) + " has the wrong type; expected a table {alias, chat_template_kwargs}");
      continue;
    }
    TableReader r(*t, p, sink, preset_keys());
    EffortPreset e;
    lines["presets[" + std::to_string(i) + "]"] = r.line("alias");
    if (auto v = r.string("alias")) e.alias = *v;
    else if (!r.has("alias")) sink.error(line_of(*t), p + ".alias", p + ".alias is missing; a preset needs the id clients send");
    if (auto k = r.subtable("chat_template_kwargs")) e.chat_template_kwargs = to_json(*k);
    if (auto v = r.integer("thinking_token_budget", 0, kMaxTokens, "tokens")) e.thinking_token_budget = *v;
    out.push_back(std::move(e));
  }
  return out;
}

std::optional<double> parse_number_text(const std::string& s) {
  if (s.empty()) return std::nullopt;
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  if (end != s.c_str() + s.size()) return std::nullopt;
  return v;
}

void check_placeholders(const ModelEntry& m, const std::string& prefix, DiagnosticSink& sink, const KeyLines& lines) {
  const auto& names = placeholder_names();
  std::string valid;
  for (const auto& n : names) valid += (valid.empty() ? "{" : ", {") + n + "}";
  auto check = [&](const std::string& text, const std::string& where) {
    for (const auto& ph : placeholders_in(text)) {
      int line = lines.count(where) ? lines.at(where) : m.location.line;
      std::string key = prefix + "." + where;
      if (std::find(names.begin(), names.end(), ph) == names.end()) {
        std::string hint = closest_key(ph, names);
        sink.error(line, key, key + " = \"" + text + "\" uses unknown placeholder {" + ph + "}" +
                                  (hint.empty() ? "" : "; did you mean {" + hint + "}?") + " (valid: " + valid + ")");
        continue;
      }
      std::string needs;
      if (ph == "kv_cache_bytes" && !m.kv_cache_bytes_per_token) needs = "kv_cache_bytes_per_token";
      if (ph == "util" && !m.util) needs = "util";
      if (ph == "cpu_offload_gib" && !m.cpu_offload_gib) needs = "cpu_offload_gib";
      if (ph == "hot_profile" && m.hot_profile.empty()) needs = "hot_profile";
      if (!needs.empty())
        sink.error(line, key, key + " = \"" + text + "\" uses {" + ph + "} but " + prefix + "." + needs + " is not set");
    }
  };
  check(m.program, "program");
  for (std::size_t i = 0; i < m.args.size(); ++i) check(m.args[i], "args[" + std::to_string(i) + "]");
  for (const auto& [k, v] : m.env) check(v, "env." + k);
}

void check_contradictions(const ModelEntry& m, const std::string& prefix, DiagnosticSink& sink, const KeyLines& lines) {
  auto line = [&](const std::string& k) { return lines.count(k) ? lines.at(k) : m.location.line; };
  auto at = [&](const std::string& k) { return " (line " + std::to_string(line(k)) + ")"; };
  if (m.validated_ctx && m.ctx > *m.validated_ctx)
    sink.error(line("ctx"), prefix + ".ctx",
               prefix + ".ctx = " + std::to_string(m.ctx) + " exceeds validated_ctx = " + std::to_string(*m.validated_ctx) +
                   at("validated_ctx") + "; a context is served only after a prompt of that length was prefilled");
  if (m.model_max_ctx) {
    std::string src = m.model_max_ctx_discovered ? " (discovered from " + m.checkpoint + "/config.json)"
                                                 : at("model_max_ctx");
    if (m.ctx > *m.model_max_ctx)
      sink.error(line("ctx"), prefix + ".ctx",
                 prefix + ".ctx = " + std::to_string(m.ctx) + " exceeds model_max_ctx = " +
                     std::to_string(*m.model_max_ctx) + src);
    if (m.validated_ctx && *m.validated_ctx > *m.model_max_ctx)
      sink.error(line("validated_ctx"), prefix + ".validated_ctx",
                 prefix + ".validated_ctx = " + std::to_string(*m.validated_ctx) + " exceeds model_max_ctx = " +
                     std::to_string(*m.model_max_ctx) + src);
  }
  if (auto kv = m.kv_cache_bytes(); kv && *kv > k_max_kv_cache_bytes)
    sink.error(line("kv_cache_bytes_per_token"), prefix + ".kv_cache_bytes_per_token",
               prefix + ": ctx = " + std::to_string(m.ctx) + " × kv_cache_bytes_per_token = " +
                   std::to_string(*m.kv_cache_bytes_per_token) + " is a KV cap of " +
                   (*kv == INT64_MAX ? std::string("more than 2^63") : std::to_string(*kv)) +
                   " bytes; expected at most 2^48 (256 TiB)");
  if (m.cpu_offload_gib && m.host_ram_gib && *m.host_ram_gib < *m.cpu_offload_gib + kLoaderTransientGib)
    sink.error(line("host_ram_gib"), prefix + ".host_ram_gib",
               prefix + ".host_ram_gib = " + format_number(*m.host_ram_gib) + " is below cpu_offload_gib " +
                   format_number(*m.cpu_offload_gib) + " + 30 = " + format_number(*m.cpu_offload_gib + kLoaderTransientGib) +
                   " GiB (the loader's transient copies need ~30 GiB beyond the offload)");
  if (m.cpu_offload_gib && !m.host_ram_gib)
    sink.error(line("cpu_offload_gib"), prefix + ".host_ram_gib",
               prefix + ".host_ram_gib is missing while cpu_offload_gib = " + format_number(*m.cpu_offload_gib) +
                   "; declare at least " + format_number(*m.cpu_offload_gib + kLoaderTransientGib) + " GiB");
  // Offload declared three ways (cpu_offload_gib, --cpu-offload-gb, CPU_OFFLOAD_GB): all must agree.
  std::optional<std::string> argv_raw = arg_value(m.args, "--cpu-offload-gb");
  std::optional<double> argv_off = argv_raw ? parse_number_text(*argv_raw) : std::nullopt;
  std::optional<double> env_off;
  auto env_it = m.env.find("CPU_OFFLOAD_GB");
  if (env_it != m.env.end()) env_off = parse_number_text(env_it->second);
  std::string argv_line_key;
  for (std::size_t i = 0; i < m.args.size(); ++i)
    if (m.args[i].rfind("--cpu-offload-gb", 0) == 0) argv_line_key = "args[" + std::to_string(i) + "]";
  if (argv_off && env_off && *argv_off != *env_off)
    sink.error(line("env.CPU_OFFLOAD_GB"), prefix + ".env.CPU_OFFLOAD_GB",
               prefix + ".env.CPU_OFFLOAD_GB = \"" + env_it->second + "\" differs from argv --cpu-offload-gb " +
                   *argv_raw + at(argv_line_key) + "; vLLM takes the flag, the hot-expert pinner reads the env");
  if (argv_off && m.cpu_offload_gib && *argv_off != *m.cpu_offload_gib)
    sink.error(line(argv_line_key), prefix + "." + argv_line_key,
               prefix + ".args --cpu-offload-gb " + *argv_raw + " differs from cpu_offload_gib = " +
                   format_number(*m.cpu_offload_gib) + at("cpu_offload_gib"));
  if (env_off && m.cpu_offload_gib && !argv_off && *env_off != *m.cpu_offload_gib)
    sink.error(line("env.CPU_OFFLOAD_GB"), prefix + ".env.CPU_OFFLOAD_GB",
               prefix + ".env.CPU_OFFLOAD_GB = \"" + env_it->second + "\" differs from cpu_offload_gib = " +
                   format_number(*m.cpu_offload_gib) + at("cpu_offload_gib"));
  // Presets must ask for efforts the template accepts.
  const auto& acc = m.policies.accepted_reasoning_efforts;
  for (std::size_t i = 0; i < m.presets.size(); ++i) {
    const auto& kw = m.presets[i].chat_template_kwargs;
    if (acc.empty() || !kw.contains("reasoning_effort") || !kw["reasoning_effort"].is_string()) continue;
    std::string effort = kw["reasoning_effort"].get<std::string>();
    if (std::find(acc.begin(), acc.end(), effort) == acc.end()) {
      std::string k = "presets[" + std::to_string(i) + "]";
      std::string valid;
      for (const auto& a : acc) valid += (valid.empty() ? "" : ", ") + a;
      sink.error(line(k), prefix + "." + k + ".chat_template_kwargs.reasoning_effort",
                 prefix + "." + k + ".chat_template_kwargs.reasoning_effort = \"" + effort +
                     "\" is not in policies.accepted_reasoning_efforts; valid: " + valid);
    }
  }
  if (m.health_path.empty() || m.health_path[0] != '/')
    sink.error(line("health_path"), prefix + ".health_path",
               prefix + ".health_path = \"" + m.health_path + "\" must start with '/'");
}

}  // namespace

ModelEntry parse_model(const std::string& name, const toml::table& t, const std::string& config_dir,
                       DiagnosticSink& sink, KeyLines& lines) {
  const std::string prefix = "models." + name;
  TableReader r(t, prefix, sink, model_keys());
  ModelEntry m;
  m.name = name;
  m.location = SourceLocation{sink.file, line_of(t), 0};
  m.config_dir = config_dir;
  for (auto&& [k, v] : t) {
    std::string key(k.str());
    lines[key] = line_of(v);
    if (auto a = v.as_array())
      for (std::size_t i = 0; i < a->size(); ++i) lines[key + "[" + std::to_string(i) + "]"] = line_of(*a->get(i));
    if (auto sub = v.as_table(); sub && key == "env")
      for (auto&& [ek, ev] : *sub) lines["env." + std::string(ek.str())] = line_of(ev);
  }

  if (auto v = r.string("engine")) {
    if (auto k = engine_kind_from_string(*v)) m.engine = *k;
    else sink.error(r.line("engine"), r.key_path("engine"),
                    r.key_path("engine") + " = \"" + *v + "\" is not an engine; valid: native, vllm, llama.cpp, command");
  } else if (!r.has("engine")) {
    sink.error(line_of(t), r.key_path("engine"), r.key_path("engine") + " is missing; valid: native, vllm, llama.cpp, command");
  }
  m.served_name = r.string("served_name").value_or(name);
  if (auto v = r.string_array("aliases")) m.aliases = *v;
  if (auto a = r.array("presets")) m.presets = parse_presets(*a, prefix + ".presets", sink, lines);
  m.description = r.string("description").value_or("");
  if (auto v = r.string("checkpoint")) m.checkpoint = resolve_config_path(*v, config_dir);
  if (auto v = r.string("program")) {
    // A bare name ("servedeck-worker") is searched in $PATH at launch; anything with a '/' or '~' is a path.
    m.program = (v->find('/') != std::string::npos || (*v)[0] == '~') ? resolve_config_path(*v, config_dir) : *v;
  } else if (!r.has("program")) {
    sink.error(line_of(t), r.key_path("program"), r.key_path("program") + " is missing; the executable (or venv interpreter) to start");
  }
  if (auto v = r.string_array("args")) m.args = *v;
  if (auto v = r.string_table("env")) m.env = *v;
  if (auto v = r.string("host")) m.host = *v;
  if (auto v = r.integer("port", 0, 65535, "TCP port; 0 = pick a free port")) m.port = static_cast<int>(*v);
  if (auto v = r.integer("gpu", 0, 255, "GPU index")) m.gpu = static_cast<int>(*v);
  if (auto v = r.boolean("requires_gpu")) m.requires_gpu = *v;
  if (auto v = r.integer("ctx", 1, kMaxTokens, "tokens")) m.ctx = *v;
  else if (!r.has("ctx")) sink.error(line_of(t), r.key_path("ctx"), r.key_path("ctx") + " is missing; the context served, in tokens");
  if (auto v = r.integer("validated_ctx", 1, kMaxTokens, "tokens")) m.validated_ctx = *v;
  if (auto v = r.integer("prefilled_ctx", 1, kMaxTokens, "tokens")) m.prefilled_ctx = *v;
  if (auto v = r.integer("model_max_ctx", 1, kMaxTokens, "tokens")) m.model_max_ctx = *v;
  if (auto v = r.integer("kv_cache_bytes_per_token", 1, int64_t{1} << 30, "bytes per token")) m.kv_cache_bytes_per_token = *v;
  if (auto v = r.number("util", 0, 1, true, "fraction of total VRAM")) m.util = *v;
  if (auto v = r.number("host_ram_gib", 0, kMaxGib, false, "GiB")) m.host_ram_gib = *v;
  if (auto v = r.number("cpu_offload_gib", 0, kMaxGib, false, "GiB")) m.cpu_offload_gib = *v;
  if (auto v = r.number("shm_gib", 0, kMaxGib, false, "GiB")) m.shm_gib = *v;
  if (auto v = r.number("load_floor_offload_gib", 0, kMaxGib, false, "GiB")) m.load_floor_offload_gib = *v;
  if (auto v = r.boolean("pins_host_memory")) m.pins_host_memory = *v;
  if (auto v = r.boolean("uses_cuda_ipc")) m.uses_cuda_ipc = *v;
  if (auto v = r.string("hot_profile")) m.hot_profile = resolve_config_path(*v, config_dir);
  if (auto v = r.number("hot_profile_offload_gib", 0, kMaxGib, false, "GiB")) m.hot_profile_offload_gib = *v;
  if (auto v = r.string("health_path")) m.health_path = *v;
  if (auto v = r.integer("start_timeout_s", 1, 86400, "seconds")) m.start_timeout_s = static_cast<int>(*v);
  if (auto v = r.integer("stop_timeout_s", 1, 3600, "seconds")) m.stop_timeout_s = static_cast<int>(*v);
  if (auto v = r.integer("drain_timeout_s", 0, 3600, "seconds")) m.drain_timeout_s = static_cast<int>(*v);
  if (auto v = r.integer("vram_release_timeout_s", 0, 3600, "seconds")) m.vram_release_timeout_s = static_cast<int>(*v);
  if (auto v = r.string_array("shm_globs")) {
    m.shm_globs = *v;
    for (std::size_t i = 0; i < v->size(); ++i)
      if (auto problem = shm_glob_problem((*v)[i]))
        sink.error(lines["shm_globs[" + std::to_string(i) + "]"], prefix + ".shm_globs[" + std::to_string(i) + "]",
                   prefix + ".shm_globs[" + std::to_string(i) + "] = \"" + (*v)[i] + "\" " + *problem);
  }
  if (auto v = r.boolean("warmup")) m.warmup = *v;
  if (auto v = r.boolean("switch_on_request")) m.switch_on_request = *v;
  if (auto v = r.boolean("vision")) m.vision = *v;
  if (auto v = r.integer("queue_max", 0, 100000, "requests")) m.queue_max = static_cast<int>(*v);
  if (auto v = r.integer("queue_timeout_s", 0, 86400, "seconds")) m.queue_timeout_s = static_cast<int>(*v);
  if (auto v = r.integer("min_residency_s", 0, 86400 * 7, "seconds")) m.min_residency_s = static_cast<int>(*v);
  if (auto v = r.integer("connect_timeout_ms", 1, 3600000, "milliseconds")) m.connect_timeout_ms = static_cast<int>(*v);
  if (auto v = r.integer("first_byte_timeout_ms", 1, 86400000, "milliseconds")) m.first_byte_timeout_ms = static_cast<int>(*v);
  if (auto v = r.integer("max_gap_ms", 1, 86400000, "milliseconds")) m.max_gap_ms = static_cast<int>(*v);
  if (auto v = r.integer("request_timeout_s", 1, 86400, "seconds")) m.request_timeout_s = static_cast<int>(*v);
  if (auto v = r.boolean("restart_on_failure")) m.restart_on_failure = *v;
  if (auto v = r.integer("liveness_interval_s", 0, 86400, "seconds; 0 = no health probe after ready"))
    m.liveness_interval_s = static_cast<int>(*v);
  if (auto v = r.integer("liveness_idle_s", 0, 86400, "seconds; 0 = no idle completion probe"))
    m.liveness_idle_s = static_cast<int>(*v);
  if (auto v = r.integer("liveness_timeout_s", 1, 3600, "seconds")) m.liveness_timeout_s = static_cast<int>(*v);
  if (auto p = r.subtable("policies")) m.policies = parse_policies(*p, prefix + ".policies", sink, lines);

  // Discovery: config.json's max_position_embeddings (through text_config when nested).
  MaxCtxDiscovery d = discover_model_max_ctx(m.checkpoint);
  if (!d.error.empty()) sink.warning(r.line("checkpoint"), prefix + ".checkpoint", prefix + ".checkpoint: " + d.error);
  if (!m.model_max_ctx && d.max_ctx) {
    m.model_max_ctx = d.max_ctx;
    m.model_max_ctx_discovered = true;
  } else if (m.model_max_ctx && d.max_ctx && *m.model_max_ctx != *d.max_ctx) {
    sink.warning(r.line("model_max_ctx"), prefix + ".model_max_ctx",
                 prefix + ".model_max_ctx = " + std::to_string(*m.model_max_ctx) + " differs from " + d.source +
                     " = " + std::to_string(*d.max_ctx) + " in " + m.checkpoint + "; the declared value is used");
  }

  check_placeholders(m, prefix, sink, lines);
  check_contradictions(m, prefix, sink, lines);
  return m;
}

}  // namespace servedeck::registry::detail
