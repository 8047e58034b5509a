#include "policies/flatten_content.hpp"

#include "policies/json_util.hpp"
#include "policies/repair_count.hpp"

namespace servedeck::policies {

using json = nlohmann::json;

std::optional<std::string> join_text_parts(const json& content) {
  if (!content.is_array()) return std::nullopt;
  std::string out;
  bool first = true;
  for (const auto& part : content) {
    if (part.is_string()) {
      out += (first ? "" : "\n") + part.get<std::string>();
      first = false;
      continue;
    }
    if (!part.is_object() || !part.contains("text") || !part["text"].is_string()) return std::nullopt;
    std::string type = part.contains("type") ? string_field(part, "type") : std::string("text");
    if (type != "text" && type != "input_text" && type != "output_text") return std::nullopt;
    out += (first ? "" : "\n") + part["text"].get<std::string>();
    first = false;
  }
  return out;
}

void apply_flatten_content(json& body, RequestContext& ctx) {
  if (!ctx.model || !ctx.model->policies.flatten_content || !body.is_object()) return;
  if (!body.contains("messages") || !body["messages"].is_array()) return;
  for (auto& m : body["messages"]) {
    if (!m.is_object() || !m.contains("content")) continue;
    std::string role = string_field(m, "role");
    if (role != "tool" && role != "system" && role != "assistant" && role != "developer") continue;
    if (auto joined = join_text_parts(m["content"])) {
      m["content"] = *joined;
      count_repair(ctx, "flatten_content");
    }
  }
}

}  // namespace servedeck::policies
