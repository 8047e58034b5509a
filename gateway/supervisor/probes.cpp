#include "gateway/supervisor/probes.hpp"

#include <algorithm>

#include <nlohmann/json.hpp>

#include "common/http/client.hpp"
#include "common/json_limits.hpp"
#include "preflight/preflight.hpp"

namespace servedeck::supervisor {

std::string utf8_excerpt(std::string_view text, std::size_t max_bytes) {
  static constexpr std::string_view k_replacement = "\xEF\xBF\xBD";  // U+FFFD
  std::string out;
  out.reserve(std::min(text.size(), max_bytes));
  std::size_t i = 0;
  while (i < text.size()) {
    const auto c = static_cast<unsigned char>(text[i]);
    std::size_t len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    bool ok = len > 0 && i + len <= text.size();
    for (std::size_t k = 1; ok && k < len; ++k) ok = (static_cast<unsigned char>(text[i + k]) & 0xC0) == 0x80;
    if (ok && len > 1) {  // no overlong forms, surrogates or code points above U+10FFFF
      const auto c1 = static_cast<unsigned char>(text[i + 1]);
      if (len == 2) ok = c >= 0xC2;
      if (len == 3) ok = !(c == 0xE0 && c1 < 0xA0) && !(c == 0xED && c1 >= 0xA0);
      if (len == 4) ok = c <= 0xF4 && !(c == 0xF0 && c1 < 0x90) && !(c == 0xF4 && c1 >= 0x90);
    }
    const std::string_view piece = ok ? text.substr(i, len) : k_replacement;
    if (out.size() + piece.size() > max_bytes) break;
    out += piece;
    i += ok ? len : 1;
  }
  return out;
}

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
    if (!r.ok) r.detail = utf8_excerpt(res.body, k_probe_excerpt_bytes);
  } catch (const std::exception& e) {
    r.detail = utf8_excerpt(e.what(), k_probe_excerpt_bytes);
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
      r.detail = utf8_excerpt(res.body, k_probe_excerpt_bytes);
      return r;
    }
    auto j = parse_untrusted(res.body);
    if (j.is_discarded() || !j.is_object() || !j.contains("choices") || !j["choices"].is_array() ||
        j["choices"].empty()) {
      r.detail = "200 without a JSON body carrying choices: " + utf8_excerpt(res.body, k_probe_excerpt_bytes);
      return r;
    }
    r.ok = true;
  } catch (const std::exception& e) {
    r.detail = utf8_excerpt(e.what(), k_probe_excerpt_bytes);
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
