// ProxyCall (proxy_internal.hpp), reading what the engine sends: SSE events through the
// response policies into the stream normaliser, the role-only prefix held back until real
// output, engine error events and the G09 retry, the end of the stream (finish chunk, [DONE],
// or a closed connection), engine error bodies and the non-streaming answer.
#include "gateway/server/proxy_internal.hpp"

#include "common/json_limits.hpp"
#include "gateway/server/engine_chunk.hpp"
#include "gateway/server/request_body.hpp"
#include "gateway/server/request_notes.hpp"

namespace servedeck::gateway {

namespace {

/// HTTP status for an engine error object: its numeric code when it is one, else 502.
int status_for_engine_error(const json& err) {
  if (err.is_object()) {
    if (auto c = err.find("code"); c != err.end() && c->is_number_integer()) {
      auto v = c->get<int64_t>();
      if (v >= 400 && v <= 599) return static_cast<int>(v);
    }
  }
  return 502;
}

/// A header value without the spaces and tabs around it (RFC 9110 section 5.5: OWS).
std::string trim(std::string_view v) {
  while (!v.empty() && (v.front() == ' ' || v.front() == '\t')) v.remove_prefix(1);
  while (!v.empty() && (v.back() == ' ' || v.back() == '\t')) v.remove_suffix(1);
  return std::string(v);
}

/// ASCII lower case (header tokens and media types are case-insensitive).
std::string lowercase(std::string v) {
  for (char& c : v)
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  return v;
}

}  // namespace

namespace detail {

sse::Parser ProxyCall::make_parser() { return sse::Parser(k_max_engine_event, sse::Parser::OnOverflow::stop); }

void ProxyCall::on_upstream_data(std::string_view bytes) {
  if (done_) return;
  if (upstream_status_ != 200 || !stream_ || !not_sse_type_.empty()) {
    progressed_ = true;
    if (engine_text_.size() + bytes.size() > k_max_engine_body)
      return fail(502, "the engine's answer exceeds " + std::to_string(k_max_engine_body) + " bytes",
                  "server_error", "engine_body_too_large", ErrorSource::servedeck);
    engine_text_.append(bytes);
    return;
  }
  const int attempt = attempt_;
  for (auto& ev : parser_.feed(bytes)) {
    if (!ev.comment) progressed_ = true;  // a comment is no sign of life (`: keepalive` forever)
    handle_event(ev);
    if (done_ || attempt != attempt_) return;  // ended, or retried (G09): the rest is stale
  }
  if (parser_.overflow())
    return fail(502, "the engine sent an SSE event of more than " + std::to_string(k_max_engine_event) + " bytes",
                "server_error", "engine_event_too_large", ErrorSource::engine);
}

void ProxyCall::handle_event(const sse::Event& ev, bool at_end) {
  if (ev.comment) return;
  if (ev.data == "[DONE]") return finish_stream();
  JsonError perr;
  json chunk = parse_untrusted(ev.data, &perr);
  if (chunk.is_discarded()) {
    if (at_end)
      return fail(502, "the engine closed the stream inside an event (" + std::to_string(ev.data.size()) +
                           " bytes of it read: " + perr.message + ")",
                  "server_error", "upstream_closed", ErrorSource::engine);
    return fail(502, "the engine sent a malformed event: " + perr.message, "server_error", "engine_bad_event",
                ErrorSource::engine);
  }
  if (chunk.is_object() && chunk.contains("error")) return on_engine_error(chunk["error"]);
  // Valid JSON that is not a chunk (an array, a number, `choices` not an array, an index out of
  // range) ends the stream here, before the policies or the normaliser read it.
  if (std::string bad = engine_chunk_error(chunk, {requested_choices(engine_body_), chat_}); !bad.empty())
    return fail(502, bad, "server_error", "engine_bad_event", ErrorSource::engine);
  std::vector<json> chunks;
#ifdef SERVEDECK_HAVE_POLICIES
  if (stream_pipeline_)
    chunks = stream_pipeline_->on_chunk(chunk);
  else
    chunks.push_back(std::move(chunk));
#else
  chunks.push_back(std::move(chunk));
#endif
  std::string out;
  for (const auto& c : chunks) normalizer_->on_chunk(c, out);
  if (!normalizer_->bound_error().empty()) {
    // The normaliser passed a bound on what it keeps: the stream ends here, upstream cancelled.
    if (!client_started_ && !normalizer_->produced_output())
      return fail(502, normalizer_->bound_error(), "server_error", "stream_too_large", ErrorSource::engine);
    error_code_ = "stream_too_large";
    std::string all = held_ + out;  // `out` ends with the normaliser's error event
    held_.clear();
    return end_stream(std::move(all));
  }
  deliver(std::move(out));
  if (!done_) end_on_policy_error();
}

bool ProxyCall::end_on_policy_error() {
#ifdef SERVEDECK_HAVE_POLICIES
  if (!stream_pipeline_ || !stream_pipeline_->error()) return false;
  // The answer cannot be repaired into a valid one: nothing more the engine sends can change
  // that, so it is not read any further (fail cancels the upstream call).
  const policies::PolicyError perr = *stream_pipeline_->error();
  fail(502, perr.message, "server_error", perr.code, ErrorSource::servedeck);
  return true;
#else
  return false;
#endif
}

void ProxyCall::deliver(std::string out) {
  if (out.empty()) return;
  if (!normalizer_->produced_output() && !client_started_) {
    held_ += out;  // only a role chunk so far (G09: it may still be retried away)
    return;
  }
  if (!ttft_ms_) ttft_ms_ = ms_since(job_.start);
  start_client_stream();
  if (!held_.empty()) {
    out.insert(0, held_);
    held_.clear();
  }
  write_client(out);
}

void ProxyCall::on_engine_error(const json& err) {
  if (!normalizer_->produced_output() && !retried_ && normalizer_->emitted_any()) {
    // G09: only the role chunk came before the error: retry once, transparently.
    retried_ = true;
    ++attempt_;  // the rest of this attempt's events are stale (the cancel lands later)
    if (upstream_ended_) return restart_attempt();  // the error was the last event of a closed stream
    retrying_ = true;
    upstream_->cancel();
    return;
  }
  if (!client_started_) {
    error_param_ = engine_param(err);
    return fail(status_for_engine_error(err), engine_message(err), engine_type(err), engine_code(err),
                ErrorSource::engine);
  }
  std::string out = held_;
  held_.clear();
  normalizer_->fail_with_engine_error(err, out);
  error_code_ = engine_code(err);
  end_stream(std::move(out));
}

std::string ProxyCall::engine_message(const json& err) {
  if (err.is_object() && err.contains("message") && err["message"].is_string()) return err["message"].get<std::string>();
  return err.is_string() ? err.get<std::string>() : dump_safe(err);
}

std::string ProxyCall::engine_type(const json& err) {
  if (err.is_object() && err.contains("type") && err["type"].is_string()) return err["type"].get<std::string>();
  return "server_error";
}

std::string ProxyCall::engine_param(const json& err) {
  if (!err.is_object()) return {};
  auto p = err.find("param");
  if (p == err.end() || !p->is_string()) return {};
  return p->get_ref<const std::string&>().substr(0, 256);
}

std::string ProxyCall::engine_code(const json& err) {
  if (err.is_object() && err.contains("code")) {
    const auto& c = err["code"];
    if (c.is_string() && !c.get_ref<const std::string&>().empty()) return c.get<std::string>();
    if (c.is_number()) return dump_safe(c);
  }
  return "engine_error";
}

void ProxyCall::finish_stream() {
  if (done_) return;
  std::string out;
#ifdef SERVEDECK_HAVE_POLICIES
  if (stream_pipeline_) {
    std::optional<policies::PolicyError> perr;
    auto rest = stream_pipeline_->finish(perr);
    for (const auto& c : rest) normalizer_->on_chunk(c, out);
    if (perr) {
      deliver(std::move(out));
      if (done_) return;
      return fail(502, perr->message, "server_error", perr->code, ErrorSource::servedeck);
    }
  }
#endif
  if (!normalizer_->produced_output() && !client_started_)
    return fail(502, "the engine's stream ended without any content, reasoning or tool call", "server_error",
                "empty_stream", ErrorSource::engine);
  deliver(std::move(out));
  if (done_) return;
  out.clear();
  if (normalizer_->finish(out) == StreamEnd::error)
    error_code_ = normalizer_->bound_error().empty() ? "empty_stream" : "stream_too_large";
  end_stream(std::move(out));
}

void ProxyCall::restart_attempt() {
  retrying_ = false;
  parser_ = make_parser();
  normalizer_.emplace(normalizer_options());
  held_.clear();
  upstream_status_ = 0;
  not_sse_type_.clear();
  engine_text_.clear();
  progressed_ = false;  // the failed attempt's last event is no progress of the new one
  send_upstream();
}

bool ProxyCall::fail_if_switched(const std::string& detail) {
  if (!shared_.slots) return false;
  const SlotSnapshot snap = shared_.slots->snapshot();
  const std::string& mine = job_.model->name;
  if (snap.model == mine && snap.state == SlotState::ready) return false;  // nobody stopped it
  std::string target;  // the model the slot is being switched to; "" for a stop
  if (!snap.switching_to.empty() && snap.switching_to != mine) target = snap.switching_to;
  else if (!snap.model.empty() && snap.model != mine) target = snap.model;
  const bool stopped = snap.model == mine && (snap.state == SlotState::stopping || snap.state == SlotState::stopped);
  if (target.empty() && !stopped) return false;  // still this model's slot (a crash, a restart)
  const http::Headers retry{{"Retry-After", std::to_string(shared_.retry_after_s)}};
  if (!target.empty()) {
    fail(503,
         "the switch to model '" + target + "' ended this request: model '" + mine + "' was stopped (its drain_timeout_s is " +
             std::to_string(job_.model->drain_timeout_s) + " s) while the request was in flight (" + detail + ")",
         "overloaded_error", "model_switched", ErrorSource::servedeck, retry);
  } else {
    fail(503, "model '" + mine + "' was stopped while this request was in flight (" + detail + ")", "overloaded_error",
         "model_stopped", ErrorSource::servedeck, retry);
  }
  return true;
}

void ProxyCall::on_upstream_end(UpstreamFailure f, const std::string& detail) {
  upstream_ended_ = true;
  if (retrying_) return restart_attempt();
  if (done_) return;
  if (f == UpstreamFailure::cancelled) return on_client_gone();
  if (f == UpstreamFailure::closed || f == UpstreamFailure::io || f == UpstreamFailure::connect) {
    if (fail_if_switched(detail)) return;
  }
  if (f == UpstreamFailure::none || f == UpstreamFailure::closed) {
    if (upstream_status_ != 200) {
      if (f == UpstreamFailure::closed && upstream_status_ == 0)
        return fail(502, "the engine closed the connection without answering (" + detail + ")", "server_error",
                    "upstream_closed", ErrorSource::engine);
      return answer_engine_error_body();
    }
    if (!stream_ || !not_sse_type_.empty()) {
      if (f == UpstreamFailure::closed)
        return fail(502, "the engine closed the connection before its answer was complete (" + detail + ")",
                    "server_error", "upstream_closed", ErrorSource::engine);
      return not_sse_type_.empty() ? answer_body() : not_sse_answer();
    }
    if (auto last = parser_.finish()) {
      handle_event(*last, true);
      if (done_ || !upstream_ended_) return;  // ended, or a G09 retry started a new attempt
    }
    if (normalizer_->finish_seen()) return finish_stream();
    // f == none: the body ended by its own framing (Content-Length reached, or the last chunk).
    return fail(502, "the engine closed the stream before its finish chunk or [DONE] (" +
                         (detail.empty() ? std::string("its response body ended at its declared length or last chunk")
                                         : detail) +
                         ")",
                "server_error", "upstream_closed", ErrorSource::engine);
  }
  if (f == UpstreamFailure::request_timeout)
    return fail(504, detail + "; request_timeout_s = " + std::to_string(job_.model->request_timeout_s) + " s",
                "timeout_error", "upstream_request_timeout", ErrorSource::servedeck);
  // The engine took the request and sent nothing: liveness hears about it (the slot may become
  // unhealthy instead of every later client waiting out the same deadline).
  if (f == UpstreamFailure::first_byte_timeout && shared_.slots)
    shared_.slots->report_unresponsive(job_.model->name, job_.engine_port, detail);
  if (f == UpstreamFailure::connect_timeout || f == UpstreamFailure::first_byte_timeout ||
      f == UpstreamFailure::gap_timeout)
    return fail(504, detail, "timeout_error", std::string("upstream_") + std::string(to_string(f)),
                ErrorSource::servedeck);
  if (f == UpstreamFailure::connect)
    return fail(502, "cannot reach the engine of model '" + job_.model->name + "': " + detail, "server_error",
                "engine_unreachable", ErrorSource::servedeck);
  fail(502, detail, "server_error", "upstream_io", ErrorSource::servedeck);
}

void ProxyCall::on_upstream_head(int status, const std::map<std::string, std::string>& headers) {
  upstream_status_ = status;
  auto header = [&](const char* name) {
    auto it = headers.find(name);  // upstream.cpp lower-cases the names
    return it == headers.end() ? std::string() : it->second;
  };
  const std::string encoding = lowercase(trim(header("content-encoding")));
  if (!encoding.empty() && encoding != "identity")
    return fail(502, "the engine answered HTTP " + std::to_string(status) + " with Content-Encoding '" +
                         log_safe(encoding, 100) +
                         "'; servedeck asks for Accept-Encoding: identity and reads no compressed body",
                "server_error", "engine_bad_response", ErrorSource::engine);
  if (!stream_ || status != 200) return;
  const std::string type = header("content-type");
  const std::string media = lowercase(trim(type.substr(0, type.find(';'))));
  // No Content-Type at all is read as SSE (some engines omit it); any other type is not.
  if (!media.empty() && media != "text/event-stream") not_sse_type_ = log_safe(trim(type), 100);
}

void ProxyCall::not_sse_answer() {
  JsonError perr;
  json j = parse_untrusted(engine_text_, &perr);
  if (j.is_object() && j.contains("error")) return on_engine_error(j["error"]);
  fail(502, "the engine answered a streamed request with HTTP 200 and Content-Type '" + not_sse_type_ + "' (" +
                std::to_string(engine_text_.size()) + " bytes: " + log_safe(engine_text_, k_max_quoted_event_bytes) +
                "); expected text/event-stream",
       "server_error", "engine_bad_response", ErrorSource::engine);
}

void ProxyCall::answer_engine_error_body() {
  JsonError perr;
  json j = parse_untrusted(engine_text_, &perr);
  json err = j.is_object() && j.contains("error") ? j["error"] : json();
  std::string message = err.is_null() ? (engine_text_.empty() ? "the engine answered HTTP " + std::to_string(upstream_status_)
                                                              : engine_text_.substr(0, 2000))
                                      : engine_message(err);
  int status = upstream_status_ >= 400 && upstream_status_ <= 599 ? upstream_status_ : 502;
  error_param_ = engine_param(err);
  fail(status, message, err.is_null() ? "server_error" : engine_type(err),
       err.is_null() ? "engine_http_" + std::to_string(upstream_status_) : engine_code(err), ErrorSource::engine);
}

void ProxyCall::answer_body() {
  JsonError perr;
  json body = parse_untrusted(engine_text_, &perr);
  if (body.is_discarded() || !body.is_object())
    return fail(502, "the engine's answer is not a JSON object: " + perr.message, "server_error", "engine_bad_body",
                ErrorSource::engine);
  if (body.contains("error")) {
    const json err = body["error"];
    error_param_ = engine_param(err);
    return fail(status_for_engine_error(err), engine_message(err), engine_type(err), engine_code(err),
                ErrorSource::engine);
  }
#ifdef SERVEDECK_HAVE_POLICIES
  if (response_ctx_) {
    policies::ResponsePipeline rp(*response_ctx_);
    if (auto perr2 = rp.apply_body(body)) return fail(502, perr2->message, "server_error", perr2->code, ErrorSource::servedeck);
  }
#endif
  if (!StreamNormalizer::normalize_body(body, job_.requested_id, normalizer_options().id_seed))
    return fail(502, "the engine's answer carries no content, reasoning or tool call", "server_error",
                "empty_response", ErrorSource::engine);
  if (auto u = body.find("usage"); u != body.end() && u->is_object()) usage_ = *u;
  StreamNormalizer::add_missing_usage(body, prompt_estimate_);  // G12: flagged estimate, not logged
  ttft_ms_ = ms_since(job_.start);
  done_ = true;
  if (capture_) captured_body_ = body;
  job_.res->send(200, "application/json", dump_safe(body), client_headers_);
  record(200);
}

}  // namespace detail

}  // namespace servedeck::gateway
