#include "policies/request_cleanup.hpp"

#include "policies/json_util.hpp"
#include "policies/repair_count.hpp"

namespace servedeck::policies {
namespace {

using json = nlohmann::json;

const json* options_of(const registry::PolicyConfig& config) {
  if (!config.extra.is_object() || !config.extra.contains("request_cleanup")) return nullptr;
  return &config.extra["request_cleanup"];
}

}  // namespace

bool request_cleanup_enabled(const registry::PolicyConfig& config) {
  const json* o = options_of(config);
  if (!o) return false;
  if (o->is_boolean()) return o->get<bool>();
  return o->is_object();
}

void apply_request_cleanup(json& body, RequestContext& ctx) {
  if (!ctx.model || !body.is_object() || !request_cleanup_enabled(ctx.model->policies)) return;
  std::vector<std::string> changes;
  if (body.contains("messages") && body["messages"].is_array()) {
    for (auto& m : body["messages"]) {
      if (!m.is_object() || string_field(m, "role") != "assistant") continue;
      for (const char* k : {"refusal", "audio", "function_call", "tool_calls"}) {
        if (m.contains(k) && (m[k].is_null() || (std::string_view(k) == "tool_calls" && m[k].is_array() && m[k].empty()))) {
          m.erase(k);
          changes.push_back(std::string("messages[].") + k);
        }
      }
    }
  }
  if (body.contains("tools") && body["tools"].is_array()) {
    for (auto& t : body["tools"]) {
      if (!t.is_object()) continue;
      for (auto it = t.begin(); it != t.end();) {
        if (it.key() != "type" && it.key() != "function") {
          changes.push_back("tools[]." + it.key());
          it = t.erase(it);
        } else {
          ++it;
        }
      }
      if (!t.contains("function") || !t["function"].is_object()) continue;
      auto& f = t["function"];
      for (auto it = f.begin(); it != f.end();) {
        if (it.key() != "name" && it.key() != "description" && it.key() != "parameters" && it.key() != "strict") {
          changes.push_back("tools[].function." + it.key());
          it = f.erase(it);
        } else {
          ++it;
        }
      }
      if (!f.contains("parameters") || f["parameters"].is_null()) {
        f["parameters"] = json{{"type", "object"}, {"properties", json::object()}};
        changes.push_back("tools[].function.parameters (added)");
      }
    }
  }
  const json* o = options_of(ctx.model->policies);
  if (o && o->is_object() && o->contains("drop_top_level") && (*o)["drop_top_level"].is_array()) {
    for (const auto& k : (*o)["drop_top_level"]) {
      if (k.is_string() && body.contains(k.get<std::string>())) {
        body.erase(k.get<std::string>());
        changes.push_back(k.get<std::string>());
      }
    }
  }
  if (changes.empty()) return;
  count_repair(ctx, "request_cleanup");
  std::string note = "removed or fixed:";
  for (const auto& c : changes) note += " " + c;
  log_note(ctx, "request_cleanup", note);
}

}  // namespace servedeck::policies
