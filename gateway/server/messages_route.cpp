#include "gateway/server/messages_route.hpp"

#include <utility>  // before Boost.Asio: boost 1.74 awaitable.hpp needs std::exchange

#include <boost/asio.hpp>

#include "common/json_limits.hpp"
#include "gateway/anthropic/messages_responder.hpp"
#include "gateway/anthropic/request_translator.hpp"
#include "gateway/server/engine_tokenize.hpp"
#include "gateway/server/request_body.hpp"
#include "gateway/server/request_notes.hpp"
#include "gateway/server/usage_estimate.hpp"
#ifdef SERVEDECK_HAVE_POLICIES
#include "policies/pipeline.hpp"
#endif

namespace servedeck::gateway {

using nlohmann::json;
using clock_type = std::chrono::steady_clock;

namespace {

constexpr int k_count_timeout_ms = 10000;  // /tokenize answers in well under a second

/// The parse, the model and the translation every Messages route starts with. Answers the
/// client itself (and returns null) when one of them fails.
struct Prepared {
  const registry::ModelEntry* entry = nullptr;
  std::string id;
  std::shared_ptr<anthropic::TranslatedRequest> translated;
};

std::optional<Prepared> prepare(const MessagesRoutes& routes, const http::Request& req, http::Responder& res,
                                bool count_only, clock_type::time_point t0) {
  JsonError perr;
  const json body = parse_untrusted(req.body, &perr);
  Prepared p;
  const bool stream = body.is_object() && body.contains("stream") && body["stream"].is_boolean() && body["stream"].get<bool>();
  const bool has_model = body.is_object() && body.contains("model") && body["model"].is_string();
  if (has_model) p.id = body["model"].get<std::string>();
  auto local = [&](int status, const std::string& message, const char* code) {
    send_messages_error(res, status, message);
    if (!count_only) record_local_answer(*routes.shared, Route::messages, p.entry ? p.entry->name : "", p.id, stream,
                                         status, code, t0);
  };
  if (body.is_discarded()) {
    local(400, perr.message, "invalid_json");
    return std::nullopt;
  }
  // note: every string `model` is looked up, "" included: the routes use the entry of every
  // request that passes here (a missing or non-string model is translate_request's 400).
  if (has_model) p.entry = routes.reg->find_by_id(p.id);
  if (has_model && !p.entry) {
    std::string known;
    for (const auto& m : routes.reg->models)
      for (const auto& i : m.all_ids()) known += (known.empty() ? "" : ", ") + i;
    local(404, "model: '" + quoted_client_id(p.id) + "' is not configured; configured ids: " + known, "model_not_found");
    return std::nullopt;
  }
  anthropic::TranslateOptions opt;
  if (p.entry) {
    opt.strip_billing_header = p.entry->policies.strip_billing_header;
    opt.vision = p.entry->vision;
    opt.model_name = p.entry->name;
  }
  p.translated = std::make_shared<anthropic::TranslatedRequest>();
  if (auto err = anthropic::translate_request(body, opt, *p.translated)) {
    local(400, err->message, "invalid_messages_request");
    return std::nullopt;
  }
  log_request_notes("/v1/messages", p.id, p.translated->warnings);
  return p;
}

void send_count(http::Responder& res, int64_t tokens, const std::string& estimated_why) {
  json out = {{"input_tokens", tokens}};
  if (!estimated_why.empty()) {
    out["servedeck_estimated"] = true;
    out["servedeck_estimate_reason"] = estimated_why;
  }
  res.send(200, "application/json", dump_safe(out));
}

}  // namespace

bool is_messages_path(std::string_view path) {
  return path == "/v1/messages" || path.rfind("/v1/messages/", 0) == 0;
}

void send_messages_error(http::Responder& res, int status, const std::string& message, http::Headers extra) {
  res.send(status, "application/json",
           dump_safe(anthropic::error_body(anthropic::error_type_for_status(status), message)), std::move(extra));
}

void handle_messages(const MessagesRoutes& routes, const http::Request& req, std::shared_ptr<http::Responder> res) {
  const auto t0 = clock_type::now();
  auto p = prepare(routes, req, *res, false, t0);
  if (!p) return;
  auto adapter = std::make_shared<anthropic::MessagesResponder>(res, p->translated, p->id);
  routes.run_chat(p->translated->chat, std::move(adapter), t0);
}

void handle_count_tokens(const MessagesRoutes& routes, const http::Request& req, std::shared_ptr<http::Responder> res) {
  const auto t0 = clock_type::now();
  auto p = prepare(routes, req, *res, true, t0);
  if (!p) return;
  json chat = p->translated->chat;
  chat["model"] = p->entry->served_name;
  clean_chat_request(chat);
#ifdef SERVEDECK_HAVE_POLICIES
  // The prompt as /v1/messages would send it (effort presets, kwargs, restored reasoning).
  policies::RequestContext rc;
  rc.model = p->entry;
  rc.requested_id = p->id;
  rc.preset = routes.reg->find_preset(p->id);
  policies::RequestPipeline rp(rc);
  if (auto err = rp.apply(chat)) return send_messages_error(*res, 400, *err);
#endif
  const int64_t estimate = estimate_request_tokens(chat);
  Lease lease = engine_tokenizes_chat(*p->entry) ? routes.slots->acquire(p->entry->name) : nullptr;
  if (!lease) {
    const std::string why = engine_tokenizes_chat(*p->entry)
                                ? "model '" + p->entry->name + "' is not running, so its tokenizer cannot count"
                                : "the engine of model '" + p->entry->name + "' has no chat /tokenize";
    return send_count(*res, estimate, why);
  }
  const auto snap = routes.slots->snapshot();
  auto strand = boost::asio::make_strand(*routes.shared->upstream_ioc);
  count_chat_tokens(strand, snap.host, snap.port, *p->entry, chat, k_count_timeout_ms,
                    [res, lease, estimate](TokenCount c) {
                      if (c.tokens) return send_count(*res, *c.tokens, "");
                      send_count(*res, estimate, c.why);
                    });
}

}  // namespace servedeck::gateway
