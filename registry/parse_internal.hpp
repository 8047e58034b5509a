// Internal to servedeck_registry: the per-table parsers shared by registry.cpp and parse_model.cpp.
#pragma once

#include <map>
#include <string>

#include "registry/model_entry.hpp"
#include "registry/toml_reader.hpp"

namespace servedeck::registry::detail {

/// Line of each key of a model table (and of nested keys, dotted: "policies.capture",
/// "args[3]", "env.CPU_OFFLOAD_GB"), for cross-field messages.
using KeyLines = std::map<std::string, int>;

/// Parses [models.NAME]; paths resolve against `config_dir`. Reports problems that involve only
/// this table (types, ranges, placeholders, ctx/validated/max, RAM vs offload, env vs argv).
ModelEntry parse_model(const std::string& name, const toml::table& t, const std::string& config_dir,
                       DiagnosticSink& sink, KeyLines& lines);

/// Every key [models.NAME] accepts, in documentation order.
const std::vector<std::string>& model_keys();
const std::vector<std::string>& policy_keys();
const std::vector<std::string>& preset_keys();
const std::vector<std::string>& server_keys();
const std::vector<std::string>& rule_keys();

}  // namespace servedeck::registry::detail
