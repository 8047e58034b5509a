#include "gateway/server/models_route.hpp"

#include "gateway/server/request_notes.hpp"
#include "common/json_limits.hpp"
#include "gateway/server/messages_route.hpp"

namespace servedeck::gateway {

using nlohmann::json;

json model_object(const registry::ModelEntry& m, const std::string& id) {
  return json{{"id", id},
              {"object", "model"},
              {"created", 0},
              {"owned_by", "servedeck"},
              {"root", m.served_name},
              {"max_model_len", m.ctx},
              {"type", "model"},
              {"display_name", id},
              {"created_at", "1970-01-01T00:00:00Z"}};
}

void handle_models(const registry::Registry& reg, http::Responder& res) {
  json data = json::array();
  for (const auto& m : reg.models) {
    data.push_back(model_object(m, m.served_name));
    for (const auto& a : m.aliases) data.push_back(model_object(m, a));
    for (const auto& p : m.presets) data.push_back(model_object(m, p.alias));
  }
  json first = data.empty() ? json(nullptr) : data.front()["id"];
  json last = data.empty() ? json(nullptr) : data.back()["id"];
  res.send(200, "application/json",
           dump_safe(json{{"object", "list"}, {"data", std::move(data)}, {"has_more", false},
                          {"first_id", std::move(first)}, {"last_id", std::move(last)}}));
}

void handle_model(const registry::Registry& reg, const http::Request& req, http::Responder& res) {
  const std::string id = req.path.substr(std::string_view("/v1/models/").size());
  if (const registry::ModelEntry* m = reg.find_by_id(id))
    return res.send(200, "application/json", dump_safe(model_object(*m, id)));
  const std::string message = "model: '" + quoted_client_id(id) + "' is not configured";
  if (!req.header("anthropic-version").empty()) return send_messages_error(res, 404, message);
  http::send_error(res, 404, message, "invalid_request_error", "model_not_found");
}

}  // namespace servedeck::gateway
