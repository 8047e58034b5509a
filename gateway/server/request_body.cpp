#include "gateway/server/request_body.hpp"

#include "common/json_limits.hpp"

#include <vector>

namespace servedeck::gateway {

using nlohmann::json;

namespace {

bool is_empty_value(const json& v) {
  if (v.is_null()) return true;
  if (v.is_string()) return v.get_ref<const std::string&>().empty();
  if (v.is_array() || v.is_object()) return v.empty();
  return false;
}

}  // namespace

int clean_chat_request(json& body) {
  if (!body.is_object()) return 0;
  int repairs = 0;
  if (auto m = body.find("messages"); m != body.end() && m->is_array()) {
    for (auto& msg : *m) {
      if (!msg.is_object()) continue;
      std::vector<std::string> drop;
      for (const auto& [k, v] : msg.items()) {
        if ((k == "refusal" || k == "audio" || k == "function_call" || k == "tool_calls" || k == "name") &&
            is_empty_value(v))
          drop.push_back(k);
      }
      for (const auto& k : drop) msg.erase(k);
      repairs += static_cast<int>(drop.size());
    }
  }
  if (auto t = body.find("tools"); t != body.end() && t->is_array()) {
    for (auto& tool : *t) {
      if (!tool.is_object()) continue;
      auto fn = tool.find("function");
      if (fn == tool.end() || !fn->is_object()) continue;
      json clean_fn = json::object();
      for (const char* k : {"name", "description", "parameters", "strict"}) {
        if (auto it = fn->find(k); it != fn->end() && !it->is_null()) clean_fn[k] = *it;
      }
      if (!clean_fn.contains("parameters") || !clean_fn["parameters"].is_object()) {
        clean_fn["parameters"] = json{{"type", "object"}, {"properties", json::object()}};
        ++repairs;
      }
      json clean_tool = json::object();
      clean_tool["type"] = "function";
      clean_tool["function"] = std::move(clean_fn);
      if (clean_tool.size() != tool.size() || (*fn).size() != clean_tool["function"].size()) ++repairs;
      tool = std::move(clean_tool);
    }
  }
  return repairs;
}

}  // namespace servedeck::gateway
