// Shared helpers for the policy tests: model entries shaped like models.toml's GLM entry, a
// repair-counter recorder, fixture loading and SSE splitting.
#pragma once

#include <fstream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "policies/pipeline.hpp"
#include "registry/model_entry.hpp"

namespace servedeck::policies::testing {

using json = nlohmann::json;

/// The shipped GLM entry's policy figures (models.toml [models.glm53.policies]): floor 8192,
/// ctx 327680, accepted efforts low/high/max, presets -low/-high/-max.
inline registry::ModelEntry glm_entry() {
  registry::ModelEntry m;
  m.name = "glm53";
  m.served_name = "glm53-flash";
  m.ctx = 327680;
  m.policies.min_output_tokens = 8192;
  m.policies.sanitize_tool_tags = true;
  m.policies.mirror_content = false;
  m.policies.accepted_reasoning_efforts = {"low", "high", "max"};
  m.policies.default_reasoning_effort = "max";
  for (std::string e : {"low", "high", "max"}) {
    registry::EffortPreset p;
    p.alias = "glm53-flash-" + e;
    p.chat_template_kwargs = {{"reasoning_effort", e}};
    m.presets.push_back(p);
  }
  return m;
}

/// Records count_repair calls: policy → count.
struct Counter {
  std::map<std::string, int> counts;
  RepairCounter fn() {
    return [this](std::string_view policy, std::string_view model) {
      ++counts[std::string(policy)];
      last_model = std::string(model);
    };
  }
  int operator[](const std::string& p) const {
    auto it = counts.find(p);
    return it == counts.end() ? 0 : it->second;
  }
  std::string last_model;
};

inline std::string read_text(const std::string& rel) {
  std::ifstream in(std::string(SERVEDECK_SOURCE_DIR) + "/tests/policies/fixtures/" + rel, std::ios::binary);
  if (!in) throw std::runtime_error("fixture not found: " + rel);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline json fixture(const std::string& rel) { return json::parse(read_text(rel)); }

/// The JSON payloads of an SSE fixture's `data:` lines, [DONE] excluded.
inline std::vector<json> sse_chunks(const std::string& rel) {
  std::vector<json> out;
  std::istringstream in(read_text(rel));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("data: ", 0) != 0) continue;
    std::string payload = line.substr(6);
    if (payload == "[DONE]") break;
    out.push_back(json::parse(payload));
  }
  return out;
}

/// A chunk in the engine's shape.
inline json chunk(json delta, json finish = nullptr, int index = 0) {
  return {{"id", "chatcmpl-test"},
          {"object", "chat.completion.chunk"},
          {"created", 1767000000},
          {"model", "glm53-flash"},
          {"choices", json::array({{{"index", index}, {"delta", std::move(delta)}, {"finish_reason", std::move(finish)}}})}};
}

/// One streamed tool-call arguments fragment (index 0), optionally with the call's header.
inline json args_chunk(const std::string& fragment, const std::string& name = "", const std::string& id = "") {
  json tc = {{"index", 0}, {"function", {{"arguments", fragment}}}};
  if (!name.empty()) {
    tc["function"]["name"] = name;
    tc["type"] = "function";
  }
  if (!id.empty()) tc["id"] = id;
  return chunk({{"tool_calls", json::array({tc})}});
}

/// What a client would assemble from streamed chunks, choice 0.
struct Assembled {
  std::string content, reasoning_content, reasoning;
  std::map<int, json> calls;  // index → {"id","name","arguments"}
  std::vector<std::string> names_seen;  // every name fragment emitted
  std::vector<std::string> arg_fragments;  // every arguments fragment emitted, in order
  std::string finish_reason;
  int finish_chunks = 0;
  std::vector<std::string> models;  // `model` of every chunk
};

inline Assembled assemble(const std::vector<json>& chunks) {
  Assembled a;
  for (const auto& c : chunks) {
    a.models.push_back(c.value("model", std::string("<none>")));
    if (!c.contains("choices")) continue;
    for (const auto& ch : c["choices"]) {
      const json d = ch.value("delta", json::object());
      if (d.contains("content") && d["content"].is_string()) a.content += d["content"].get<std::string>();
      if (d.contains("reasoning_content") && d["reasoning_content"].is_string())
        a.reasoning_content += d["reasoning_content"].get<std::string>();
      if (d.contains("reasoning") && d["reasoning"].is_string()) a.reasoning += d["reasoning"].get<std::string>();
      if (d.contains("tool_calls")) {
        for (const auto& tc : d["tool_calls"]) {
          int i = tc.value("index", 0);
          auto& call = a.calls[i];
          if (tc.contains("id")) call["id"] = tc["id"];
          if (tc.contains("function")) {
            const auto& f = tc["function"];
            if (f.contains("name")) {
              a.names_seen.push_back(f["name"].get<std::string>());
              call["name"] = call.value("name", std::string()) + f["name"].get<std::string>();
            }
            if (f.contains("arguments")) {
              a.arg_fragments.push_back(f["arguments"].get<std::string>());
              call["arguments"] = call.value("arguments", std::string()) + f["arguments"].get<std::string>();
            }
          }
        }
      }
      if (ch.contains("finish_reason") && ch["finish_reason"].is_string()) {
        a.finish_reason = ch["finish_reason"].get<std::string>();
        ++a.finish_chunks;
      }
    }
  }
  return a;
}

/// Runs a stream through a StreamPipeline; returns every chunk out (finish() included).
inline std::vector<json> run_stream(ResponseContext& ctx, const std::vector<json>& in,
                                    std::optional<PolicyError>* error_out = nullptr) {
  StreamPipeline p(ctx);
  std::vector<json> out;
  for (const auto& c : in) {
    for (auto& o : p.on_chunk(c)) out.push_back(std::move(o));
  }
  std::optional<PolicyError> err;
  for (auto& o : p.finish(err)) out.push_back(std::move(o));
  if (error_out) *error_out = err;
  return out;
}

}  // namespace servedeck::policies::testing
