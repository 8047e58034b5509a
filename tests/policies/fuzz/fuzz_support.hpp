// Shared by the policy fuzz targets: a model with every policy switched on, the request that
// declares its tools, and the checks each target makes on what comes out.
//
// A finding is a sanitizer report, an escaped exception, an input slower than the -timeout, or
// one of these violated invariants (each traps):
//   - what the pipelines produce serialises with dump_safe and parses back with parse_untrusted
//     (the gateway sends it on);
//   - the default work budget is never spent: the inputs are at most 8 KiB, so spending its
//     64 steps per byte + 4 Mi means a super-linear path.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "common/json_limits.hpp"
#include "policies/pipeline.hpp"
#include "policies/restore_reasoning.hpp"
#include "registry/model_entry.hpp"

namespace servedeck::fuzz {

using nlohmann::json;

/// A GLM-like entry with every policy on.
inline registry::ModelEntry all_policies_model() {
  registry::ModelEntry m;
  m.name = "glm53";
  m.served_name = "glm53-flash";
  m.ctx = 131072;
  m.policies.min_output_tokens = 8192;
  m.policies.sanitize_tool_tags = true;
  m.policies.coerce_tool_argument_types = true;
  m.policies.answer_rescue = true;
  m.policies.mirror_content = true;
  m.policies.restore_reasoning = true;
  m.policies.flatten_content = true;
  m.policies.accepted_reasoning_efforts = {"low", "high", "max"};
  m.policies.default_reasoning_effort = "max";
  m.policies.extra = {{"answer_rescue", {{"think_split_hold_chars", 64}}}};
  registry::EffortPreset p;
  p.alias = "glm53-flash-low";
  p.chat_template_kwargs = {{"reasoning_effort", "low"}};
  m.presets.push_back(p);
  return m;
}

/// Two declared tools: `read` (path required, a typed integer and array) and `search`.
inline json tools() {
  auto fn = [](const char* name, json properties, json required) {
    return json{{"type", "function"},
                {"function", {{"name", name}, {"parameters", {{"type", "object"}, {"properties", std::move(properties)},
                                                              {"required", std::move(required)}}}}}};
  };
  return json::array({fn("read", {{"path", {{"type", "string"}}}, {"limit", {{"type", "integer"}}}, {"lines", {{"type", "array"}}}},
                         {"path"}),
                      fn("search", {{"query", {{"type", "string"}}}, {"max_results", {{"type", json::array({"integer", "null"})}}}}, json::array())});
}

inline json tools_request() {
  return {{"model", "glm53-flash"}, {"messages", json::array({{{"role", "user"}, {"content", "hi"}}})}, {"tools", tools()}};
}

inline std::string_view text_of(const std::uint8_t* data, std::size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

/// Traps unless `j` survives the gateway's serialise-and-parse round.
inline void check_sendable(const json& j) {
  std::string text = dump_safe(j);
  if (parse_untrusted(text).is_discarded()) __builtin_trap();
}

/// Traps when the default budget was spent.
inline void check_budget(const policies::WorkBudget& b) {
  if (b.exhausted()) __builtin_trap();
}

}  // namespace servedeck::fuzz
