// "expert_bytes" and "hot_cache": a native worker entry's declarations against the bytes its
// checkpoint's routed experts take in the format the checkpoint ships (registry/expert_footprint.hpp).
// An FP8 checkpoint's experts are half a BF16 one's and an NVFP4 one's about 0.28: an offload or a
// host RAM figure copied from another format's entry is off by that much, and the VRAM a hot-expert
// cache of N slots needs, or the slots a --vram-budget-gib leaves, follow the same bytes.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "preflight/checks.hpp"
#include "registry/expert_footprint.hpp"
#include "registry/rules.hpp"

namespace servedeck::preflight::checks {

namespace {

constexpr double k_gib = 1024.0 * 1024.0 * 1024.0;
constexpr int64_t k_stage_group = 8;  // experts per prefill staging buffer (CudaBackendOptions::stage_group)

std::optional<double> number_arg(const std::vector<std::string>& args, const char* flag) {
  auto v = registry::arg_value(args, flag);
  if (!v || v->empty()) return std::nullopt;
  char* end = nullptr;
  const double d = std::strtod(v->c_str(), &end);
  if (!end || *end != '\0' || !std::isfinite(d)) return std::nullopt;
  return d;
}

std::string mib(uint64_t bytes) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2f MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
  return buf;
}

}  // namespace

void experts(Context& c) {
  const registry::ModelEntry& m = c.m;
  if (m.engine != registry::EngineKind::native || m.checkpoint.empty()) return;
  const registry::ExpertFootprint f = registry::discover_expert_footprint(m.checkpoint);
  if (!f.error.empty()) {
    c.add("expert_bytes", Verdict::warn, "config unreadable", "the checkpoint's expert bytes",
          f.error + "; the offload and VRAM declarations are not checked against the checkpoint");
    return;
  }
  if (!f.found) return;  // no config.json (the checkpoint check reports a missing path) or no routed experts
  const double expert_gib = static_cast<double>(f.expert_bytes()) / k_gib;
  const std::string reading = std::to_string(f.moe_layers) + " MoE layers x " + std::to_string(f.experts) + " experts x " +
                              mib(f.bytes_per_expert) + " (" + f.format + ") = " + gib(expert_gib);
  std::vector<std::string> problems;
  bool refuse = false;
  if (m.cpu_offload_gib && std::fabs(*m.cpu_offload_gib - expert_gib) > kMeasuredTolerance * expert_gib)
    problems.push_back("cpu_offload_gib " + num(*m.cpu_offload_gib) + " GiB is not the checkpoint's " + gib(expert_gib) +
                       " of " + f.format + " experts (bf16 would be " +
                       gib(static_cast<double>(registry::expert_bytes_in("bf16", f.hidden, f.moe_intermediate)) *
                           static_cast<double>(f.moe_layers * f.experts) / k_gib) +
                       "): a figure from another format's entry");
  if (m.host_ram_gib && *m.host_ram_gib < expert_gib) {
    refuse = true;
    problems.push_back("host_ram_gib " + num(*m.host_ram_gib) + " GiB cannot hold the " + gib(expert_gib) +
                       " of experts the worker pins");
  } else if (m.host_ram_gib && *m.host_ram_gib < expert_gib + kLoaderTransientGib) {
    problems.push_back("host_ram_gib " + num(*m.host_ram_gib) + " GiB < experts " + gib(expert_gib) + " + " +
                       num(kLoaderTransientGib) + " GiB of loader headroom");
  }
  const std::string limit = m.cpu_offload_gib ? "cpu_offload_gib " + num(*m.cpu_offload_gib) : std::string("no offload declared");
  if (problems.empty()) {
    c.add("expert_bytes", Verdict::pass, reading, limit, "routed experts: " + reading);
  } else {
    std::string msg = reading + ": ";
    for (std::size_t i = 0; i < problems.size(); ++i) msg += (i ? "; " : "") + problems[i];
    c.add("expert_bytes", refuse ? Verdict::refuse : Verdict::warn, reading, limit, msg);
  }

  // The CUDA backend's VRAM: resident weights (bf16) + the hot-expert cache + the prefill
  // staging ring + the KV cap, with the backend's own arithmetic (cuda_backend_load.cu).
  std::vector<std::string> args(c.launch.argv.begin() + (c.launch.argv.empty() ? 0 : 1), c.launch.argv.end());
  auto backend = registry::arg_value(args, "--backend");
  if (!backend || *backend != "cuda") return;
  const double fraction = number_arg(args, "--hot-fraction").value_or(1.0);
  int64_t slots = std::llround(std::clamp(fraction, 0.0, 1.0) * static_cast<double>(f.experts));
  const auto sb = number_arg(args, "--stage-buffers");
  const int64_t buffers = sb && *sb >= 2 ? static_cast<int64_t>(*sb)
                                         : std::max<int64_t>(2, (f.experts + k_stage_group - 1) / k_stage_group);
  const double staging = static_cast<double>(buffers * k_stage_group) * static_cast<double>(f.bytes_per_expert);
  const double resident = static_cast<double>(f.resident_bytes);
  std::string note;
  if (auto budget = number_arg(args, "--vram-budget-gib"); budget && *budget > 0) {
    const double room = *budget * k_gib - resident - staging - 2.0 * k_gib;
    const auto fit = room <= 0 ? int64_t{0}
                               : static_cast<int64_t>(room / (static_cast<double>(f.bytes_per_expert) * static_cast<double>(f.moe_layers)));
    if (fit < slots) {
      note = "; --vram-budget-gib " + num(*budget) + " leaves room for " + std::to_string(fit) + " (asked " +
             std::to_string(slots) + ")";
      slots = fit;
    }
  }
  const double hot = static_cast<double>(f.hot_cache_bytes(slots));
  const double kv = m.kv_cache_bytes() ? static_cast<double>(*m.kv_cache_bytes()) : 0.0;
  const double need = resident + hot + staging + kv;
  const std::string hot_reading = "hot " + std::to_string(slots) + " of " + std::to_string(f.experts) + " experts x " +
                                  std::to_string(f.moe_layers) + " layers = " + gib(hot / k_gib) + note;
  const std::string breakdown = "resident " + gib(resident / k_gib) + " + hot " + gib(hot / k_gib) + " + staging " +
                                gib(staging / k_gib) + " + KV " + gib(kv / k_gib) + " = " + gib(need / k_gib);
  auto total = c.readings.gpu_total_gib(m.gpu);
  if (m.util && total && need > *m.util * *total * k_gib) {
    c.add("hot_cache", Verdict::warn, hot_reading, "util " + num(*m.util) + " x " + gib(*total),
          breakdown + " > util " + num(*m.util) + " x " + gib(*total) + " = " + gib(*m.util * *total) +
              ": the worker will not fit; lower --hot-fraction or raise util");
  } else {
    c.add("hot_cache", Verdict::pass, hot_reading, m.util ? "util " + num(*m.util) : std::string("util not declared"),
          hot_reading + " (" + f.format + "); VRAM " + breakdown);
  }
}

}  // namespace servedeck::preflight::checks
