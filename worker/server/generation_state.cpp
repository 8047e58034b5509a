#include "worker/server/generation_state.hpp"

#include "common/json_limits.hpp"
#include "common/openai_error.hpp"
#include "common/sse.hpp"

namespace servedeck::worker {

nlohmann::json GenerationState::envelope(nlohmann::json choices) const {
  return {{"id", id}, {"object", chunk_object}, {"created", created}, {"model", model}, {"choices", std::move(choices)}};
}

bool GenerationState::write(const nlohmann::json& j) {
  if (!res->write(sse::format_data(dump_json(j)))) {
    handle->cancel();
    return false;
  }
  return true;
}

bool GenerationState::open_stream() {
  if (started) return true;
  started = true;
  if (!res->start_stream(200)) {
    handle->cancel();
    return false;
  }
  return true;
}

bool GenerationState::end_unfinished(const GenerationResult& r) {
  if (r.finish == FinishReason::cancelled) {
    metrics->count_request(route, 499);  // client closed the request (nginx's code)
    if (started) res->end();
    return true;
  }
  if (r.finish != FinishReason::error) return false;
  metrics->count_request(route, 500);
  if (!started) {
    http::send_error(*res, 500, r.error, "server_error", "generation_failed", true);
  } else {
    res->write(sse::format_data(dump_json(make_error(r.error, "server_error", "generation_failed", ErrorSource::engine))));
    res->end();
  }
  return true;
}

void GenerationState::close_stream(const GenerationResult& r) {
  if (params.include_usage) {
    nlohmann::json usage = envelope(nlohmann::json::array());
    usage["usage"] = usage_json(r);
    write(usage);
  }
  res->write(sse::k_done);
  res->end();
}

nlohmann::json parse_request_object(const RouteContext& ctx, const char* route, const http::Request& req,
                                    http::Responder& res, std::string_view expected) {
  if (auto deep = check_json_nesting(req.body)) {
    reply_error(ctx, route, res, 400, *deep + "; request bodies are limited to " + std::to_string(k_max_json_depth) + " levels",
                "invalid_request_error", "invalid_json");
    return nlohmann::json::value_t::discarded;
  }
  JsonError error;
  auto body = parse_untrusted(req.body, &error);
  if (body.is_discarded() || !body.is_object()) {
    reply_error(ctx, route, res, 400,
                "request body is not a JSON object (read " + std::to_string(req.body.size()) + " bytes" +
                    (body.is_discarded() ? ", not valid JSON: " + error.message : ": " + describe_value(body)) +
                    "); expected " + std::string(expected),
                "invalid_request_error", "invalid_json");
    return nlohmann::json::value_t::discarded;
  }
  return body;
}

}  // namespace servedeck::worker
