// Small synchronous calls to a vLLM-compatible engine used by the probes: /tokenize and
// /v1/completions with logprobs. Each throws std::runtime_error naming the route, the status
// and the body the engine answered.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace servedeck::tools {

struct EngineAddress {
  std::string host = "127.0.0.1";
  int port = 0;
  int timeout_ms = 120000;
};

/// POST `path` with `body`; returns the parsed JSON of a 200 answer.
nlohmann::json post_json(const EngineAddress& at, const std::string& path, const nlohmann::json& body);

/// Token ids of `body` through /tokenize (vLLM shape: {"tokens": [...]}).
std::vector<int64_t> tokenize(const EngineAddress& at, const nlohmann::json& body);

}  // namespace servedeck::tools
