#include "gateway/anthropic/messages_responder.hpp"

#include "common/json_limits.hpp"
#include "common/random_id.hpp"

namespace servedeck::gateway::anthropic {

using nlohmann::json;

namespace {

std::string string_field(const json& j, const char* key) {
  if (!j.is_object()) return {};
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
}

/// Anthropic's type for an OpenAI error object met mid-stream (no HTTP status to go by): a
/// numeric `code` is a status; otherwise the OpenAI type, where the two vocabularies meet.
std::string stream_error_type(const json& err) {
  if (err.is_object())
    if (auto c = err.find("code"); c != err.end() && c->is_number_integer()) {
      // Read whole: a code of 4294967696 must not wrap onto 400. Out of the status range: api_error.
      const auto code = c->get<int64_t>();
      return error_type_for_status(code >= 100 && code <= 599 ? static_cast<int>(code) : 500);
    }
  const std::string type = string_field(err, "type");
  if (type == "overloaded_error" || type == "invalid_request_error" || type == "authentication_error" ||
      type == "permission_error" || type == "not_found_error" || type == "rate_limit_error")
    return type;
  return "api_error";
}

std::string error_message(const json& err) {
  std::string m = string_field(err, "message");
  if (m.empty()) m = dump_safe(err).substr(0, 2000);
  const std::string code = err.is_object() && err.contains("code") && err["code"].is_string() ? err["code"].get<std::string>() : "";
  // The OpenAI envelope's code and source say what failed and who said so; keep both in the text.
  const std::string source = string_field(err, "source");
  if (!code.empty() || !source.empty())
    m += " (" + (code.empty() ? std::string() : "code " + code) + (code.empty() || source.empty() ? "" : ", ") +
         (source.empty() ? std::string() : "from " + source) + ")";
  return m;
}

}  // namespace

json error_from_openai(int status, const std::string& openai_body) {
  JsonError perr;
  const json j = parse_untrusted(openai_body, &perr);
  const json err = j.is_object() && j.contains("error") ? j["error"] : json();
  if (err.is_null()) return error_body(error_type_for_status(status), openai_body.substr(0, 2000));
  std::string type = error_type_for_status(status);
  if (string_field(err, "code") == "model_not_found") type = "not_found_error";
  return error_body(type, error_message(err));
}

MessagesResponder::MessagesResponder(std::shared_ptr<http::Responder> client,
                                     std::shared_ptr<const TranslatedRequest> request, std::string requested_model)
    : client_(std::move(client)),
      request_(std::move(request)),
      request_id_(random_id("req")),
      message_id_(random_id("msg")),
      model_(std::move(requested_model)),
      translator_(message_id_, model_, *request_) {}

void MessagesResponder::send(int status, std::string, std::string body, http::Headers extra_headers) {
  std::lock_guard<std::mutex> lock(mu_);
  extra_headers.emplace_back("request-id", request_id_);
  if (status != 200) {
    client_->send(status, "application/json", dump_safe(error_from_openai(status, body)), std::move(extra_headers));
    return;
  }
  JsonError perr;
  const json completion = parse_untrusted(body, &perr);
  if (!completion.is_object()) {
    refused_code_ = "bad_upstream_body";
    refused_status_ = 502;
    client_->send(502, "application/json",
                  dump_safe(error_body("api_error", "servedeck: the engine's chat completion could not be read: " + perr.message)),
                  std::move(extra_headers));
    return;
  }
  std::string why;
  const json msg = translate_completion(completion, message_id_, model_, *request_, &why);
  if (msg.is_null()) {
    refused_code_ = "untranslatable_answer";
    refused_status_ = 502;
    client_->send(502, "application/json", dump_safe(error_body("api_error", why)), std::move(extra_headers));
    return;
  }
  client_->send(200, "application/json", dump_safe(msg), std::move(extra_headers));
}

http::Responder::Refusal MessagesResponder::refusal() const {
  const int status = refused_status_.load();
  return status == 0 ? Refusal{} : Refusal{status, refused_code_.load()};
}

bool MessagesResponder::start_stream(int status, std::string content_type, http::Headers extra_headers) {
  std::lock_guard<std::mutex> lock(mu_);
  streaming_ = true;
  extra_headers.emplace_back("request-id", request_id_);
  if (!client_->start_stream(status, std::move(content_type), std::move(extra_headers))) return false;
  return emit(translator_.start());
}

bool MessagesResponder::emit(const std::vector<StreamEvent>& events) {
  for (const auto& e : events)
    if (!client_->write(e.to_sse())) return false;
  return true;
}

bool MessagesResponder::write(std::string_view bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!streaming_) return client_->write(bytes);
  bool ok = true;
  for (const auto& ev : parser_.feed(bytes)) {
    if (translator_.ended()) break;
    if (ev.comment) {
      ok = emit(translator_.ping()) && ok;
      continue;
    }
    if (ev.data == "[DONE]") {
      ok = emit(translator_.finish()) && ok;
      continue;
    }
    JsonError perr;
    const json chunk = parse_untrusted(ev.data, &perr);
    if (!chunk.is_object()) {
      ok = emit(translator_.fail("api_error", "servedeck: unreadable event from the engine: " + perr.message)) && ok;
      continue;
    }
    if (chunk.contains("error")) {
      ok = emit(translator_.fail(stream_error_type(chunk["error"]), error_message(chunk["error"]))) && ok;
      continue;
    }
    ok = emit(translator_.on_chunk(chunk)) && ok;
  }
  if (parser_.overflow() && !translator_.ended())
    ok = emit(translator_.fail("api_error", "servedeck: a chat event of more than 64 MiB cannot be translated")) && ok;
  return ok;
}

void MessagesResponder::end() {
  std::lock_guard<std::mutex> lock(mu_);
  if (ended_) return;
  ended_ = true;
  if (streaming_ && !translator_.ended())
    emit(translator_.fail("api_error", "servedeck: the engine's stream ended before it completed"));
  client_->end();
}

}  // namespace servedeck::gateway::anthropic
