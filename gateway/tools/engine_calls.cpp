#include "gateway/tools/engine_calls.hpp"

#include <stdexcept>

#include "common/http/client.hpp"
#include "common/json_limits.hpp"

namespace servedeck::tools {

using nlohmann::json;

json post_json(const EngineAddress& at, const std::string& path, const json& body) {
  http::ClientRequest req;
  req.host = at.host;
  req.port = at.port;
  req.method = "POST";
  req.target = path;
  req.body = dump_safe(body);
  req.timeout_ms = at.timeout_ms;
  http::ClientResponse res;
  try {
    res = http::fetch(req);
  } catch (const http::ClientError& e) {
    throw std::runtime_error(e.what());
  }
  if (res.status != 200) {
    throw std::runtime_error("POST " + path + " answered HTTP " + std::to_string(res.status) + ": " +
                             res.body.substr(0, 500));
  }
  json out = parse_untrusted(res.body);
  if (out.is_discarded()) throw std::runtime_error("POST " + path + " answered a body that is not JSON: " + res.body.substr(0, 200));
  return out;
}

std::vector<int64_t> tokenize(const EngineAddress& at, const json& body) {
  json out = post_json(at, "/tokenize", body);
  if (!out.contains("tokens") || !out["tokens"].is_array())
    throw std::runtime_error("POST /tokenize: expected {\"tokens\": [...]}, got " + dump_safe(out).substr(0, 200));
  std::vector<int64_t> ids;
  for (const auto& t : out["tokens"]) {
    if (!t.is_number_integer()) throw std::runtime_error("POST /tokenize: a token id is not an integer: " + dump_safe(t));
    ids.push_back(t.get<int64_t>());
  }
  return ids;
}

}  // namespace servedeck::tools
