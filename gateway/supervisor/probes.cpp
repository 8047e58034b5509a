#include "gateway/supervisor/probes.hpp"

#include <algorithm>

#include <nlohmann/json.hpp>

#include "common/http/client.hpp"
#include "common/json_limits.hpp"
#include "preflight/preflight.hpp"

namespace servedeck::supervisor {

ProbeResult probe_health(const std::string& host, int port, const std::string& path, int timeout_ms) {
  ProbeResult r;
  try {
    http::ClientRequest req;
    req.host = host;
    req.port = port;
    req.method = "GET";
    req.target = path.empty() ? "/health" : path;
    req.timeout_ms = timeout_ms;
    auto res = http::fetch(req);
    r.status = res.status;
    r.ok = res.status == 200;
    if (!r.ok) r.detail = res.body.substr(0, 300);
  } catch (const std::exception& e) {
    r.detail = e.what();
  }
  return r;
}

ProbeResult probe_warmup(const std::string& host, int port, const std::string& served_name, int timeout_ms) {
  ProbeResult r;
  try {
    http::ClientRequest req;
    req.host = host;
    req.port = port;
    req.method = "POST";
    req.target = "/v1/completions";
    req.body = dump_safe(nlohmann::json{{"model", served_name}, {"prompt", "hi"}, {"max_tokens", 1}});
    req.timeout_ms = timeout_ms;
    auto res = http::fetch(req);
    r.status = res.status;
    if (res.status != 200) {
      r.detail = res.body.substr(0, 300);
      return r;
    }
    auto j = parse_untrusted(res.body);
    if (j.is_discarded() || !j.is_object() || !j.contains("choices") || !j["choices"].is_array() ||
        j["choices"].empty()) {
      r.detail = "200 without a JSON body carrying choices: " + res.body.substr(0, 300);
      return r;
    }
    r.ok = true;
  } catch (const std::exception& e) {
    r.detail = e.what();
  }
  return r;
}

std::optional<double> ReadingsGpuProbe::used_mib(const std::vector<int64_t>& pids) {
  if (!readings_.gpu_total_gib(gpu_)) return std::nullopt;
  double sum = 0;
  for (const auto& p : readings_.gpu_processes(gpu_))
    if (std::find(pids.begin(), pids.end(), p.pid) != pids.end()) sum += p.used_mib;
  return sum;
}

}  // namespace servedeck::supervisor
