#include "policies/reasoning_dialects.hpp"

#include "policies/repair_count.hpp"

namespace servedeck::policies {

using json = nlohmann::json;

std::optional<std::string> reasoning_of(const json& m) {
  if (!m.is_object()) return std::nullopt;
  if (m.contains("reasoning_content") && m["reasoning_content"].is_string()) {
    return m["reasoning_content"].get<std::string>();
  }
  if (m.contains("reasoning") && m["reasoning"].is_string()) return m["reasoning"].get<std::string>();
  return std::nullopt;
}

void erase_reasoning(json& m) {
  if (!m.is_object()) return;
  m.erase("reasoning_content");
  m.erase("reasoning");
}

void set_reasoning(json& m, const std::string& text, bool mirror) {
  bool used_reasoning = m.contains("reasoning") && !m.contains("reasoning_content");
  erase_reasoning(m);
  if (mirror) {
    m["reasoning_content"] = text;
    m["reasoning"] = text;
  } else if (used_reasoning) {
    m["reasoning"] = text;
  } else {
    m["reasoning_content"] = text;
  }
}

void apply_reasoning_dialects(json& body, RequestContext& ctx) {
  if (!ctx.model || !body.is_object()) return;
  const auto& extra = ctx.model->policies.extra;
  if (extra.is_object() && extra.contains("reasoning_dialects") && extra["reasoning_dialects"].is_boolean() &&
      !extra["reasoning_dialects"].get<bool>()) {
    return;
  }
  if (!body.contains("messages") || !body["messages"].is_array()) return;
  bool changed = false;
  for (auto& m : body["messages"]) {
    if (!m.is_object() || !m.contains("reasoning")) continue;
    if (!m.contains("reasoning_content") || m["reasoning_content"].is_null()) {
      if (m["reasoning"].is_string()) m["reasoning_content"] = m["reasoning"];
    }
    m.erase("reasoning");
    changed = true;
  }
  if (changed) count_repair(ctx, "reasoning_dialects");
}

}  // namespace servedeck::policies
