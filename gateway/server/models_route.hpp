// GET /v1/models and GET /v1/models/{id}: every configured id (served name, aliases, preset
// aliases) with its own context, whatever is loaded (G31), in OpenAI's and Anthropic's
// vocabularies at once: {"id","object":"model","created","owned_by","root","max_model_len",
// "type":"model","display_name","created_at"}; the list adds has_more, first_id and last_id
// (Anthropic's pagination fields). docs/gateway.md, docs/anthropic.md.
//
// Thread-safety: pure functions of the registry.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "common/http/server.hpp"
#include "registry/model_entry.hpp"

namespace servedeck::gateway {

/// One model object for `id`, an id of `m`.
nlohmann::json model_object(const registry::ModelEntry& m, const std::string& id);

/// GET /v1/models.
void handle_models(const registry::Registry& reg, http::Responder& res);

/// GET /v1/models/{id}: that id's object, or 404 — Anthropic's not_found_error when the request
/// carries an anthropic-version header, else OpenAI's envelope with code model_not_found.
void handle_model(const registry::Registry& reg, const http::Request& req, http::Responder& res);

}  // namespace servedeck::gateway
