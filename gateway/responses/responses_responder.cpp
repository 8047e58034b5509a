#include "gateway/responses/responses_responder.hpp"

#include <ctime>

#include "common/json_limits.hpp"
#include "common/random_id.hpp"

namespace servedeck::gateway::responses {

using nlohmann::json;

ResponsesResponder::ResponsesResponder(std::shared_ptr<http::Responder> client,
                                       std::shared_ptr<const TranslatedRequest> request, std::string requested_model,
                                       StoreTurn store_turn)
    : client_(std::move(client)),
      request_(std::move(request)),
      id_(random_id("resp")),
      translator_(id_, std::move(requested_model), static_cast<int64_t>(std::time(nullptr)), *request_),
      store_turn_(std::move(store_turn)) {}

void ResponsesResponder::store_if_completed() {
  // A failed answer (finish abort or error, a cut stream) is no turn to continue from.
  if (!store_turn_ || !request_->store || translator_.status() == "failed") return;
  json messages = request_->chat.contains("messages") ? request_->chat["messages"] : json::array();
  for (auto& m : translator_.assistant_messages()) messages.push_back(m);
  store_turn_(id_, messages);
}

void ResponsesResponder::send(int status, std::string content_type, std::string body, http::Headers extra_headers) {
  std::lock_guard<std::mutex> lock(mu_);
  if (status != 200) {  // the error envelope is the same for both APIs
    client_->send(status, std::move(content_type), std::move(body), std::move(extra_headers));
    return;
  }
  JsonError perr;
  json completion = parse_untrusted(body, &perr);
  if (completion.is_discarded() || !completion.is_object()) {
    std::string why = completion.is_discarded() ? perr.message : std::string("not a JSON object");
    json err = {{"error", {{"message", "the engine's chat completion could not be read: " + why}, {"type", "server_error"},
                           {"code", "bad_upstream_body"}, {"param", nullptr}, {"source", "servedeck"}}}};
    refused_code_ = "bad_upstream_body";
    refused_status_ = 502;
    client_->send(502, "application/json", dump_safe(err));
    return;
  }
  // The same state machine as streams: one chunk carrying the whole message, then finish.
  (void)translator_.start();
  json chunk = {{"choices", json::array()}};
  if (completion.contains("usage")) chunk["usage"] = completion["usage"];
  if (completion.contains("choices") && completion["choices"].is_array() && !completion["choices"].empty() &&
      completion["choices"][0].is_object() && completion["choices"][0].contains("message")) {
    const json& choice = completion["choices"][0];
    json delta = choice["message"];
    if (delta.contains("tool_calls") && delta["tool_calls"].is_array()) {
      int i = 0;
      for (auto& tc : delta["tool_calls"])
        if (tc.is_object()) tc["index"] = i++;
    }
    chunk["choices"].push_back({{"index", 0}, {"delta", delta}, {"finish_reason", choice.value("finish_reason", json(nullptr))}});
  }
  (void)translator_.on_chunk(chunk);
  (void)translator_.finish();
  json r = translator_.response();
  store_if_completed();
  client_->send(200, "application/json", dump_safe(r), std::move(extra_headers));
}

http::Responder::Refusal ResponsesResponder::refusal() const {
  const int status = refused_status_.load();
  return status == 0 ? Refusal{} : Refusal{status, refused_code_.load()};
}

bool ResponsesResponder::start_stream(int status, std::string content_type, http::Headers extra_headers) {
  std::lock_guard<std::mutex> lock(mu_);
  streaming_ = true;
  if (!client_->start_stream(status, std::move(content_type), std::move(extra_headers))) return false;
  return emit(translator_.start());
}

bool ResponsesResponder::emit(const std::vector<StreamEvent>& events) {
  for (const auto& e : events)
    if (!client_->write(e.to_sse())) return false;
  return true;
}

bool ResponsesResponder::write(std::string_view bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!streaming_) return client_->write(bytes);
  bool ok = true;
  for (const auto& ev : parser_.feed(bytes)) {
    if (translator_.ended()) break;
    if (ev.comment) {
      ok = client_->write(sse::format_comment(ev.data)) && ok;
      continue;
    }
    if (ev.data == "[DONE]") {
      ok = emit(translator_.finish()) && ok;
      store_if_completed();
      continue;
    }
    JsonError perr;
    json chunk = parse_untrusted(ev.data, &perr);
    if (chunk.is_discarded()) {
      ok = emit(translator_.fail("bad_upstream_event", "unparseable event from the engine (" + perr.message +
                                                           "): " + ev.data.substr(0, 200))) && ok;
      continue;
    }
    if (chunk.is_object() && chunk.contains("error")) {
      const json& e = chunk["error"];
      std::string code = e.is_object() && e.contains("code") && !e["code"].is_null()
                             ? (e["code"].is_string() ? e["code"].get<std::string>() : dump_safe(e["code"])) : "upstream_error";
      std::string message = e.is_object() && e.contains("message") && e["message"].is_string()
                                ? e["message"].get<std::string>() : dump_safe(e);
      ok = emit(translator_.fail(code, message)) && ok;
      continue;
    }
    ok = emit(translator_.on_chunk(chunk)) && ok;
  }
  if (parser_.overflow() && !translator_.ended())
    ok = emit(translator_.fail("event_too_large", "a chat event of more than 64 MiB cannot be translated")) && ok;
  return ok;
}

void ResponsesResponder::end() {
  std::lock_guard<std::mutex> lock(mu_);
  if (ended_) return;
  ended_ = true;
  if (streaming_ && !translator_.ended()) {
    emit(translator_.fail("upstream_closed", "the engine's stream ended before it completed"));
  }
  client_->end();
}

}  // namespace servedeck::gateway::responses
