#include "preflight/checks.hpp"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>

#include "registry/discovery.hpp"
#include "registry/rules.hpp"

namespace servedeck::preflight::checks {

using registry::ModelEntry;

void Context::add(std::string check, Verdict v, std::string reading, std::string limit, std::string message) {
  out.push_back(CheckResult{std::move(check), v, std::move(reading), std::move(limit), std::move(message), stage});
}

std::string gib(double v) {
  if (std::isinf(v)) return "unlimited";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.1f GiB", v);
  return buf;
}

std::string size_text(double v) {
  if (std::isinf(v)) return "unlimited";
  if (v >= 1) return gib(v);
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.0f MiB", v * 1024);
  return buf;
}

std::string num(double v) {
  if (v == std::floor(v) && std::fabs(v) < 1e15) return std::to_string(static_cast<long long>(v));
  char buf[64];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

namespace {

std::string engine_text(const ModelEntry& m) { return std::string(registry::to_string(m.engine)); }

std::string holders(const std::vector<GpuProcess>& procs) {
  if (procs.empty()) return "no process listed by NVML";
  std::string s;
  for (const auto& p : procs) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.0f MiB", p.used_mib);
    s += (s.empty() ? "" : ", ") + std::string("pid ") + std::to_string(p.pid) + " " + p.name + " (" + buf + ")";
  }
  return s;
}

/// The offload the launch asks for: --cpu-offload-gb when present, else cpu_offload_gib.
std::optional<double> launch_offload(const ModelEntry& m, const registry::LaunchSpec& l) {
  std::vector<std::string> args(l.argv.begin() + (l.argv.empty() ? 0 : 1), l.argv.end());
  if (auto v = registry::arg_value(args, "--cpu-offload-gb")) {
    char* end = nullptr;
    double d = std::strtod(v->c_str(), &end);
    if (end && *end == '\0' && !v->empty()) return d;
  }
  return m.cpu_offload_gib;
}

}  // namespace

void gpu_present(Context& c) {
  const ModelEntry& m = c.m;
  std::string limit = "engine " + engine_text(m) + (m.needs_gpu() ? " needs GPU " + std::to_string(m.gpu) : " runs without a GPU");
  auto total = c.readings.gpu_total_gib(m.gpu);
  if (!total) {
    std::string why = c.readings.gpu_error();
    if (why.empty()) why = "no GPU " + std::to_string(m.gpu);
    if (m.needs_gpu())
      c.add("gpu", Verdict::refuse, "no GPU", limit, why + "; " + limit);
    else
      c.add("gpu", Verdict::pass, "no GPU", limit, "no GPU, and " + m.name + " (" + limit + ") does not need one");
    return;
  }
  auto cc = c.readings.gpu_compute_capability(m.gpu);
  std::string reading = "GPU " + std::to_string(m.gpu) + ": " + gib(*total) +
                        (cc ? ", compute capability " + std::to_string(*cc / 10) + "." + std::to_string(*cc % 10) : "");
  c.add("gpu", Verdict::pass, reading, limit, reading);
}

void vram_fit(Context& c) {
  const ModelEntry& m = c.m;
  if (!m.needs_gpu()) return;
  auto total = c.readings.gpu_total_gib(m.gpu);
  if (!total) return;  // the "gpu" row already refused
  if (!m.util) {
    c.add("vram_fit", Verdict::warn, "GPU " + std::to_string(m.gpu) + " total " + gib(*total), "util not declared",
          "util is not declared, so the VRAM fit is not checked");
    return;
  }
  double used = c.readings.gpu_used_gib(m.gpu).value_or(0);
  double free = *total - used;
  double need = *m.util * *total;
  std::string reading = "free " + gib(free) + " of " + gib(*total);
  std::string limit = "util " + num(*m.util) + " x " + gib(*total) + " = " + gib(need);
  if (free + 1e-9 < need) {
    c.add("vram_fit", Verdict::refuse, reading, limit,
          "GPU " + std::to_string(m.gpu) + " has " + gib(free) + " free < " + limit + "; held by: " +
              holders(c.readings.gpu_processes(m.gpu)));
  } else {
    c.add("vram_fit", Verdict::pass, reading, limit, reading + " >= " + limit);
  }
}

void cuda_processes(Context& c) {
  const ModelEntry& m = c.m;
  if (!m.pins_host_memory) return;
  if (!c.readings.gpu_total_gib(m.gpu)) {
    c.add("cuda_processes", Verdict::warn, "cannot list CUDA processes (no GPU)", "none while pinning host memory",
          "no GPU readings, so other CUDA processes cannot be listed");
    return;
  }
  auto procs = c.readings.gpu_processes(m.gpu);
  std::string limit = "0 other CUDA processes (pins_host_memory)";
  if (!procs.empty()) {
    c.add("cuda_processes", Verdict::refuse, std::to_string(procs.size()) + " CUDA process(es)", limit,
          std::to_string(procs.size()) + " CUDA process(es) on GPU " + std::to_string(m.gpu) + " > 0 allowed beside " +
              m.name + ", which pins host memory (a second CUDA process beside the pinned server OOM-killed the box "
              "on 2026-08-28): " + holders(procs));
  } else {
    c.add("cuda_processes", Verdict::pass, "0 CUDA processes", limit, "no other CUDA process on GPU " + std::to_string(m.gpu));
  }
}

void host_ram(Context& c) {
  const ModelEntry& m = c.m;
  auto avail = c.readings.mem_available_gib();
  if (!m.host_ram_gib) {
    c.add("host_ram", Verdict::pass, avail ? "MemAvailable " + gib(*avail) : "MemAvailable unknown",
          "host_ram_gib not declared", "no host RAM requirement declared");
    return;
  }
  std::string limit = "host_ram_gib " + num(*m.host_ram_gib) + " GiB";
  if (m.cpu_offload_gib) limit += " (cpu_offload_gib " + num(*m.cpu_offload_gib) + " + " + num(kLoaderTransientGib) + ")";
  if (!avail) {
    c.add("host_ram", Verdict::warn, "MemAvailable unreadable", limit, "/proc/meminfo has no MemAvailable; " + limit + " not checked");
    return;
  }
  std::string reading = "MemAvailable " + gib(*avail);
  if (*avail < *m.host_ram_gib)
    c.add("host_ram", Verdict::refuse, reading, limit,
          reading + " < " + limit + "; pinned pages cannot be reclaimed and there is no swap: overshooting is an OOM kill");
  else
    c.add("host_ram", Verdict::pass, reading, limit, reading + " >= " + limit);
}

void context(Context& c) {
  const ModelEntry& m = c.m;
  std::string ctx = "ctx " + std::to_string(m.ctx);
  if (m.validated_ctx) {
    std::string limit = "validated_ctx " + std::to_string(*m.validated_ctx);
    if (m.ctx > *m.validated_ctx)
      c.add("ctx_validated", Verdict::refuse, ctx, limit,
            ctx + " > " + limit + " (the largest validated context); refused, not clamped");
    else
      c.add("ctx_validated", Verdict::pass, ctx, limit, ctx + " <= " + limit);
  } else {
    c.add("ctx_validated", Verdict::warn, ctx, "validated_ctx not declared",
          ctx + " has never been validated (no validated_ctx declared)");
  }
  if (m.prefilled_ctx && m.ctx > *m.prefilled_ctx)
    c.add("ctx_prefilled", Verdict::warn, ctx, "prefilled_ctx " + std::to_string(*m.prefilled_ctx),
          ctx + " > prefilled_ctx " + std::to_string(*m.prefilled_ctx) +
              " (largest prompt actually prefilled); prompts beyond it are untested");
  std::optional<int64_t> max = m.model_max_ctx;
  std::string source = m.model_max_ctx_discovered ? " (config.json)" : "";
  if (!max) {
    auto d = registry::discover_model_max_ctx(m.checkpoint);  // the checkpoint may have appeared since load
    max = d.max_ctx;
    if (max) source = " (" + d.source + ")";
  }
  if (max) {
    std::string limit = "model_max_ctx " + std::to_string(*max) + source;
    if (m.ctx > *max)
      c.add("ctx_model_max", Verdict::refuse, ctx, limit, ctx + " > " + limit + "; refused, not clamped");
    else
      c.add("ctx_model_max", Verdict::pass, ctx, limit, ctx + " <= " + limit);
  } else {
    c.add("ctx_model_max", Verdict::warn, ctx, "model_max_ctx unknown",
          "model_max_ctx is neither declared nor readable from " + m.checkpoint + "/config.json");
  }
  if (auto kv = m.kv_cache_bytes()) {
    std::string reading = std::to_string(*kv) + " B (" + size_text(static_cast<double>(*kv) / (1024.0 * 1024 * 1024)) + ")";
    c.add("kv_cap", Verdict::pass, reading, ctx + " x " + std::to_string(*m.kv_cache_bytes_per_token) + " B/token",
          "KV cap " + reading + " = " + ctx + " x kv_cache_bytes_per_token " + std::to_string(*m.kv_cache_bytes_per_token));
  } else {
    c.add("kv_cap", Verdict::pass, "no cap", "kv_cache_bytes_per_token not declared",
          "no KV cap derived (kv_cache_bytes_per_token not declared); the engine sizes its own cache");
  }
}

void shm(Context& c) {
  const ModelEntry& m = c.m;
  if (!m.shm_gib || *m.shm_gib <= 0) return;
  std::string limit = "shm_gib " + num(*m.shm_gib) + " GiB";
  auto free = c.readings.shm_free_gib();
  if (!free) {
    c.add("shm", Verdict::refuse, "/dev/shm unreadable", limit, "statvfs(/dev/shm) failed; " + m.name + " needs " + limit);
    return;
  }
  std::string reading = "/dev/shm free " + gib(*free);
  if (*free < *m.shm_gib)
    c.add("shm", Verdict::refuse, reading, limit, reading + " < " + limit + " (buffers in /dev/shm are unreclaimable shmem)");
  else
    c.add("shm", Verdict::pass, reading, limit, reading + " >= " + limit);
}

void ptrace(Context& c) {
  const ModelEntry& m = c.m;
  if (!m.uses_cuda_ipc) return;
  auto scope = c.readings.ptrace_scope();
  std::string limit = "ptrace_scope 0 (uses_cuda_ipc)";
  if (!scope) {
    c.add("ptrace_scope", Verdict::pass, "no Yama ptrace_scope", limit, "Yama is absent: ptrace is unrestricted");
    return;
  }
  std::string reading = "ptrace_scope " + std::to_string(*scope);
  if (*scope != 0)
    c.add("ptrace_scope", Verdict::refuse, reading, limit,
          "/proc/sys/kernel/yama/ptrace_scope = " + std::to_string(*scope) + " > 0 required: " + m.name +
              " hands CUDA IPC handles between processes (sysctl kernel.yama.ptrace_scope=0)");
  else
    c.add("ptrace_scope", Verdict::pass, reading, limit, reading + " allows CUDA IPC between processes");
}

void memlock(Context& c) {
  const ModelEntry& m = c.m;
  if (!m.pins_host_memory) return;
  auto limit_gib = c.readings.memlock_limit_gib();
  double need = m.cpu_offload_gib.value_or(0);
  std::string limit = "cpu_offload_gib " + num(need) + " GiB or unlimited";
  if (!limit_gib) {
    c.add("memlock", Verdict::warn, "RLIMIT_MEMLOCK unreadable", limit, "getrlimit(RLIMIT_MEMLOCK) failed");
    return;
  }
  std::string reading = "RLIMIT_MEMLOCK " + size_text(*limit_gib);
  // note: a warning, not a refusal: cudaHostRegister pins through the NVIDIA driver, which does not
  // charge RLIMIT_MEMLOCK, so a CUDA engine pins its offload under systemd's default 8 MiB limit;
  // engines that pin with mlock(2) do need it. See docs/preflight.md.
  if (!std::isinf(*limit_gib) && *limit_gib < need)
    c.add("memlock", Verdict::warn, reading, limit,
          reading + " < " + limit + " (pinned engine; cudaHostRegister is not charged to it, mlock is: raise "
          "LimitMEMLOCK= in the unit or ulimit -l if the engine mlocks)");
  else
    c.add("memlock", Verdict::pass, reading, limit, reading + " >= " + limit);
}

void files(Context& c) {
  const ModelEntry& m = c.m;
  if (!m.checkpoint.empty()) {
    if (c.readings.path_exists(m.checkpoint))
      c.add("checkpoint", Verdict::pass, m.checkpoint, "exists", "checkpoint " + m.checkpoint + " exists");
    else
      c.add("checkpoint", Verdict::refuse, m.checkpoint + " missing", "exists",
            "checkpoint " + m.checkpoint + " does not exist");
  }
  // Program: a path is checked as is; a bare name is searched in $PATH like execvp does.
  std::string program = c.launch.program;
  std::string found;
  if (program.find('/') != std::string::npos) {
    if (c.readings.is_executable(program)) found = program;
  } else if (!program.empty()) {
    const char* path = std::getenv("PATH");
    std::string dirs = path ? path : "/usr/local/bin:/usr/bin:/bin";
    std::size_t start = 0;
    while (found.empty() && start <= dirs.size()) {
      std::size_t colon = dirs.find(':', start);
      std::string dir = dirs.substr(start, colon == std::string::npos ? std::string::npos : colon - start);
      std::string cand = (dir.empty() ? std::string(".") : dir) + "/" + program;
      if (c.readings.is_executable(cand)) found = cand;
      if (colon == std::string::npos) break;
      start = colon + 1;
    }
  }
  const bool venv = program.find("/bin/python") != std::string::npos;
  if (!found.empty())
    c.add("program", Verdict::pass, found, "executable", (venv ? "venv interpreter " : "program ") + found + " is executable");
  else if (program.find('/') != std::string::npos)
    c.add("program", Verdict::refuse, program + " missing", "executable",
          (venv ? "venv interpreter " : "program ") + program + " is missing or not executable");
  else
    c.add("program", Verdict::refuse, program + " not in PATH", "executable in PATH",
          "program " + program + " not found in PATH; searched this process's PATH=" +
              (std::getenv("PATH") ? std::string(std::getenv("PATH")) : std::string("(unset: /usr/local/bin:/usr/bin:/bin)")) +
              " (`servedeck preflight` searches the CLI's own PATH, a switch the daemon's)");

  // Hot-expert profile: advisory; the pinner falls back per layer.
  if (!m.hot_profile.empty()) {
    if (!c.readings.path_exists(m.hot_profile)) {
      c.add("hot_profile", Verdict::warn, m.hot_profile + " missing", "exists",
            "hot-expert profile " + m.hot_profile + " is missing: pinning is off and decode falls to ~11-14 tok/s "
            "(16.76 with it); regenerate with VLLM_MOE_SKEW_PERLAYER at the same CPU_OFFLOAD_GB");
    } else {
      auto off = launch_offload(m, c.launch);
      if (m.hot_profile_offload_gib && off && *m.hot_profile_offload_gib != *off)
        c.add("hot_profile", Verdict::warn, "profile captured at offload " + num(*m.hot_profile_offload_gib) + " GiB",
              "launch offload " + num(*off) + " GiB",
              "hot-expert profile captured at offload " + num(*m.hot_profile_offload_gib) + " GiB != launch offload " +
                  num(*off) + " GiB: layers stop lining up, ~10% decode (15.09 vs 16.76 tok/s measured)");
      else
        c.add("hot_profile", Verdict::pass, m.hot_profile, "exists",
              "hot-expert profile " + m.hot_profile + " present" +
                  (m.hot_profile_offload_gib ? " (captured at offload " + num(*m.hot_profile_offload_gib) + " GiB)" : ""));
    }
  }
}

void consistency(Context& c) {
  const ModelEntry& m = c.m;
  std::vector<std::string> args(c.launch.argv.begin() + (c.launch.argv.empty() ? 0 : 1), c.launch.argv.end());
  auto argv_off = registry::arg_value(args, "--cpu-offload-gb");
  auto env_it = c.launch.env.find("CPU_OFFLOAD_GB");
  if (!argv_off && env_it == c.launch.env.end() && !m.cpu_offload_gib) return;
  auto to_d = [](const std::string& s) -> std::optional<double> {
    char* end = nullptr;
    double d = std::strtod(s.c_str(), &end);
    if (s.empty() || *end != '\0') return std::nullopt;
    return d;
  };
  std::optional<double> a = argv_off ? to_d(*argv_off) : std::nullopt;
  std::optional<double> e = env_it != c.launch.env.end() ? to_d(env_it->second) : std::nullopt;
  std::string reading;
  if (argv_off) reading += "--cpu-offload-gb " + *argv_off;
  if (env_it != c.launch.env.end()) reading += (reading.empty() ? "" : ", ") + std::string("CPU_OFFLOAD_GB=") + env_it->second;
  if (m.cpu_offload_gib) reading += (reading.empty() ? "" : ", ") + std::string("cpu_offload_gib ") + num(*m.cpu_offload_gib);
  std::string problems, limits;
  auto problem = [&](const std::string& what, const std::string& limit) {
    problems += (problems.empty() ? "" : "; ") + what;
    limits += (limits.empty() ? "" : "; ") + limit;
  };
  if (argv_off && env_it != c.launch.env.end() && (!a || !e || *a != *e))
    problem("CPU_OFFLOAD_GB=" + env_it->second + " != --cpu-offload-gb " + *argv_off,
            "CPU_OFFLOAD_GB == --cpu-offload-gb");
  if (a && m.cpu_offload_gib && *a != *m.cpu_offload_gib)
    problem("--cpu-offload-gb " + *argv_off + " != cpu_offload_gib " + num(*m.cpu_offload_gib),
            "--cpu-offload-gb == cpu_offload_gib");
  std::optional<double> off = a ? a : m.cpu_offload_gib;
  if (off && m.host_ram_gib && *m.host_ram_gib < *off + kLoaderTransientGib)
    problem("host_ram_gib " + num(*m.host_ram_gib) + " < offload " + num(*off) + " + " + num(kLoaderTransientGib) + " = " +
                num(*off + kLoaderTransientGib),
            "host_ram_gib >= offload + " + num(kLoaderTransientGib));
  if (!problems.empty())
    c.add("offload_consistency", Verdict::refuse, reading, limits, problems);
  else
    c.add("offload_consistency", Verdict::pass, reading, "all equal; host_ram_gib >= offload + 30", reading + " agree");
}

void measured(Context& c) {
  if (!c.measured) return;
  const MeasuredFigures& f = *c.measured;
  const ModelEntry& m = c.m;
  std::string at = f.ctx ? " (measured at ctx " + std::to_string(f.ctx) + (f.measured_at.empty() ? "" : ", " + f.measured_at) + ")" : "";
  auto compare = [&](const std::string& check, double declared, const std::string& declared_text, double got,
                     const std::string& got_text) {
    double off = got > 0 ? std::fabs(declared - got) / got : 0;
    char pct[32];
    std::snprintf(pct, sizeof pct, "%.0f%%", off * 100);
    if (off > kMeasuredTolerance)
      c.add(check, Verdict::warn, got_text + at, declared_text,
            "declared " + declared_text + " is " + pct + " off the measured " + got_text + at + " (> 10%): update the declaration");
    else
      c.add(check, Verdict::pass, got_text + at, declared_text,
            "declared " + declared_text + " is within 10% of the measured " + got_text + " (" + pct + ")");
  };
  if (f.host_rss_gib && m.host_ram_gib)
    compare("measured_host_ram", *m.host_ram_gib, "host_ram_gib " + num(*m.host_ram_gib) + " GiB", *f.host_rss_gib,
            "peak host RSS " + gib(*f.host_rss_gib));
  if (f.peak_vram_gib && m.util) {
    if (auto total = c.readings.gpu_total_gib(m.gpu))
      compare("measured_vram", *m.util * *total, "util " + num(*m.util) + " x " + gib(*total) + " = " + gib(*m.util * *total),
              *f.peak_vram_gib, "peak VRAM " + gib(*f.peak_vram_gib));
  }
  if (f.load_time_s) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.0f s", *f.load_time_s);
    std::string limit = "start_timeout_s " + std::to_string(m.start_timeout_s) + " s";
    if (*f.load_time_s > m.start_timeout_s * (1 - kMeasuredTolerance))
      c.add("measured_load_time", Verdict::warn, std::string("load ") + buf + at, limit,
            std::string("last load took ") + buf + ", within 10% of (or over) " + limit);
    else
      c.add("measured_load_time", Verdict::pass, std::string("load ") + buf + at, limit, std::string("last load took ") + buf);
  }
}

void rules(Context& c) {
  std::optional<int> cc = c.readings.gpu_compute_capability(c.m.gpu);  // nullopt without a GPU
  registry::RuleSubject s = registry::make_rule_subject(c.m, c.reg.server, cc);
  // The launch as rendered for this port (make_rule_subject renders at m.port).
  if (!c.launch.argv.empty()) s.args.assign(c.launch.argv.begin() + 1, c.launch.argv.end());
  s.env = c.launch.env;
  auto hits = registry::evaluate_rules(c.reg.rules, s);
  for (const auto& h : hits)
    c.add("rule:" + h.rule->id, h.rule->action == "refuse" ? Verdict::refuse : Verdict::warn, h.evidence,
          "rule at " + h.rule->location.file + ":" + std::to_string(h.rule->location.line), h.message());
  if (hits.empty())
    c.add("rules", Verdict::pass, std::to_string(c.reg.rules.size()) + " rules evaluated", "none may match",
          "no [[rules]] entry matches " + c.m.name);
}

}  // namespace servedeck::preflight::checks
