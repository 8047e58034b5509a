// run_preflight and the Report it returns.
#include "preflight/preflight.hpp"

#include <algorithm>
#include <cmath>

#include "preflight/checks.hpp"

namespace servedeck::preflight {

std::string_view to_string(Verdict v) {
  switch (v) {
    case Verdict::pass: return "pass";
    case Verdict::warn: return "warn";
    case Verdict::refuse: return "refuse";
  }
  return "unknown";
}

std::string_view to_string(Stage s) {
  switch (s) {
    case Stage::declaration: return "declaration";
    case Stage::machine: return "machine";
  }
  return "unknown";
}

bool Report::refused() const {
  return std::any_of(checks.begin(), checks.end(), [](const CheckResult& c) { return c.verdict == Verdict::refuse; });
}

std::string Report::refusals() const {
  std::string out;
  for (const auto& c : checks)
    if (c.verdict == Verdict::refuse) out += (out.empty() ? "" : "\n") + c.check + ": " + c.message;
  return out;
}

nlohmann::json Report::to_json() const {
  nlohmann::json j;
  j["model"] = model;
  j["refused"] = refused();
  j["checks"] = nlohmann::json::array();
  for (const auto& c : checks)
    j["checks"].push_back({{"check", c.check},
                           {"verdict", std::string(to_string(c.verdict))},
                           {"reading", c.reading},
                           {"limit", c.limit},
                           {"message", c.message},
                           {"stage", std::string(to_string(c.stage))}});
  j["launch"] = {{"program", launch.program}, {"argv", launch.argv}, {"env", launch.env}, {"host", launch.host},
                 {"port", launch.port}};
  if (measured) {
    auto opt = [](const std::optional<double>& v) { return v ? nlohmann::json(*v) : nlohmann::json(nullptr); };
    j["measured"] = {{"peak_vram_gib", opt(measured->peak_vram_gib)},
                     {"host_rss_gib", opt(measured->host_rss_gib)},
                     {"load_time_s", opt(measured->load_time_s)},
                     {"ctx", measured->ctx},
                     {"engine_build", measured->engine_build},
                     {"measured_at", measured->measured_at}};
  } else {
    j["measured"] = nullptr;
  }
  return j;
}

namespace {

/// Single-quotes an argument for display when it has shell metacharacters.
std::string shell_quote(const std::string& s) {
  if (!s.empty() && s.find_first_of(" \t\n'\"\\$`{}[]*?;&|<>()!#~") == std::string::npos) return s;
  std::string out = "'";
  for (char ch : s) out += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
  return out + "'";
}

std::string pad(const std::string& s, std::size_t w) { return s.size() >= w ? s : s + std::string(w - s.size(), ' '); }

}  // namespace

std::string Report::table() const {
  std::size_t refusals_n = 0, warns = 0;
  for (const auto& c : checks) {
    if (c.verdict == Verdict::refuse) ++refusals_n;
    if (c.verdict == Verdict::warn) ++warns;
  }
  std::string out = "preflight " + model + ": " + (refusals_n ? "REFUSED" : "OK") + " (" + std::to_string(refusals_n) +
                    " refused, " + std::to_string(warns) + " warnings, " + std::to_string(checks.size()) + " checks)\n";
  std::size_t w_check = 5, w_reading = 7;
  for (const auto& c : checks) {
    w_check = std::max(w_check, c.check.size());
    w_reading = std::min<std::size_t>(std::max(w_reading, c.reading.size()), 48);
  }
  out += pad("check", w_check) + "  " + pad("verdict", 7) + "  " + pad("reading", w_reading) + "  limit\n";
  for (const auto& c : checks) {
    std::string v(to_string(c.verdict));
    std::transform(v.begin(), v.end(), v.begin(), [](unsigned char ch) { return static_cast<char>(std::toupper(ch)); });
    out += pad(c.check, w_check) + "  " + pad(v, 7) + "  " + pad(c.reading, w_reading) + "  " + c.limit + "\n";
    if (c.verdict != Verdict::pass) out += std::string(w_check + 2, ' ') + "-> " + c.message + "\n";
  }
  if (measured) {
    out += "last measured:";
    char buf[160];
    if (measured->peak_vram_gib) {
      std::snprintf(buf, sizeof buf, " peak VRAM %.1f GiB;", *measured->peak_vram_gib);
      out += buf;
    }
    if (measured->host_rss_gib) {
      std::snprintf(buf, sizeof buf, " peak host RSS %.1f GiB;", *measured->host_rss_gib);
      out += buf;
    }
    if (measured->load_time_s) {
      std::snprintf(buf, sizeof buf, " load %.0f s;", *measured->load_time_s);
      out += buf;
    }
    out += " ctx " + std::to_string(measured->ctx);
    if (!measured->engine_build.empty()) out += "; build " + measured->engine_build;
    if (!measured->measured_at.empty()) out += "; at " + measured->measured_at;
    out += "\n";
  }
  out += "launch env:\n";
  for (const auto& [k, v] : launch.env) out += "  " + k + "=" + shell_quote(v) + "\n";
  out += "launch argv:\n ";
  for (const auto& a : launch.argv) out += " " + shell_quote(a);
  out += "\n";
  return out;
}

namespace {

/// One check of the table below.
struct CheckDef {
  void (*run)(checks::Context&);
  Stage stage;
  const char* why;  // why stopping the running engine can (machine) or cannot (declaration) change it
};

// The checks in table order, each with its stage. `switch` runs the declaration ones before it
// stops the running engine, so a launch that cannot work does not take down one that does.
constexpr CheckDef k_checks[] = {
    {checks::gpu_present, Stage::declaration,
     "whether GPU N exists and its compute capability are properties of the hardware and driver"},
    {checks::vram_fit, Stage::machine, "free VRAM: the running engine holds most of it until it is stopped"},
    {checks::cuda_processes, Stage::machine, "the running engine is itself a CUDA process on the GPU"},
    {checks::host_ram, Stage::machine, "MemAvailable: the running engine holds host RAM (pinned offload, page cache)"},
    {checks::context, Stage::declaration,
     "ctx vs validated_ctx / prefilled_ctx / model max and the KV cap are arithmetic on the declaration and the "
     "checkpoint's config.json"},
    {checks::shm, Stage::machine, "/dev/shm free: the running engine's buffers are reaped only after the stop"},
    {checks::ptrace, Stage::declaration, "kernel.yama.ptrace_scope is a sysctl no engine changes"},
    {checks::memlock, Stage::declaration, "RLIMIT_MEMLOCK is the daemon's own limit"},
    {checks::files, Stage::declaration, "checkpoint, program and hot-expert profile are files on disk"},
    {checks::consistency, Stage::declaration, "offload in env, argv and cpu_offload_gib are all declarations"},
    {checks::experts, Stage::declaration,
     "the checkpoint's expert bytes in its format against the declared offload, host RAM and VRAM"},
    {checks::measured, Stage::declaration, "compares declarations with figures stored from an earlier launch"},
    {checks::rules, Stage::declaration,
     "[[rules]] match on the declaration, the rendered launch and the GPU's compute capability"},
};

}  // namespace

Report run_preflight(const registry::Registry& reg, const registry::ModelEntry& m, Readings& readings, int port,
                     const std::optional<MeasuredFigures>& measured, Scope scope) {
  Report r;
  r.model = m.name;
  r.measured = measured;
  r.launch = registry::render_launch(m, port, reg.server);
  checks::Context c{reg, m, readings, r.launch, measured, r.checks};
  for (const CheckDef& d : k_checks) {
    if (scope == Scope::declaration_only && d.stage != Stage::declaration) continue;
    c.stage = d.stage;
    d.run(c);
  }
  return r;
}

Report declaration_rows(const Report& r) {
  Report out = r;
  out.checks.clear();
  for (const auto& c : r.checks)
    if (c.stage == Stage::declaration) out.checks.push_back(c);
  return out;
}

}  // namespace servedeck::preflight
