// Lookups over the registry's data model (see model_entry.hpp).
#include "registry/model_entry.hpp"

namespace servedeck::registry {

std::string_view to_string(EngineKind k) {
  switch (k) {
    case EngineKind::native: return "native";
    case EngineKind::vllm: return "vllm";
    case EngineKind::llama_cpp: return "llama.cpp";
    case EngineKind::command: return "command";
  }
  return "unknown";
}

std::optional<EngineKind> engine_kind_from_string(std::string_view s) {
  if (s == "native") return EngineKind::native;
  if (s == "vllm") return EngineKind::vllm;
  if (s == "llama.cpp") return EngineKind::llama_cpp;
  if (s == "command") return EngineKind::command;
  return std::nullopt;
}

bool ModelEntry::needs_gpu() const {
  if (requires_gpu) return *requires_gpu;
  switch (engine) {
    case EngineKind::vllm: return true;
    case EngineKind::native:
    case EngineKind::command: return false;
    case EngineKind::llama_cpp: break;
  }
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    for (const char* flag : {"-ngl", "--n-gpu-layers", "--gpu-layers"}) {
      std::string value;
      const std::string f = flag;
      if (a == f && i + 1 < args.size()) value = args[i + 1];
      else if (a.rfind(f + "=", 0) == 0) value = a.substr(f.size() + 1);
      else continue;
      // A placeholder or anything but a literal 0 counts as offloading layers.
      if (value != "0") return true;
    }
  }
  return false;
}

std::vector<std::string> ModelEntry::all_ids() const {
  std::vector<std::string> ids;
  if (!served_name.empty()) ids.push_back(served_name);
  ids.insert(ids.end(), aliases.begin(), aliases.end());
  for (const auto& p : presets) ids.push_back(p.alias);
  return ids;
}

const ModelEntry* Registry::find_by_id(std::string_view id) const {
  for (const auto& m : models) {
    if (m.served_name == id) return &m;
    for (const auto& a : m.aliases)
      if (a == id) return &m;
    for (const auto& p : m.presets)
      if (p.alias == id) return &m;
  }
  return nullptr;
}

const ModelEntry* Registry::find_by_name(std::string_view name) const {
  for (const auto& m : models)
    if (m.name == name) return &m;
  return nullptr;
}

const EffortPreset* Registry::find_preset(std::string_view id) const {
  for (const auto& m : models)
    for (const auto& p : m.presets)
      if (p.alias == id) return &p;
  return nullptr;
}

}  // namespace servedeck::registry
