#include "gateway/server/proxy.hpp"

#include <utility>  // before Boost.Asio: boost 1.74 awaitable.hpp needs std::exchange

#include <cstdio>
#include <optional>

#include <boost/asio.hpp>

#include "common/openai_error.hpp"
#include "common/sse.hpp"
#include "gateway/server/request_body.hpp"
#include "gateway/server/stream_normalizer.hpp"
#include "gateway/server/upstream.hpp"
#ifdef SERVEDECK_HAVE_POLICIES
#include "policies/pipeline.hpp"
#include "policies/min_output_tokens.hpp"
#include "policies/capture.hpp"
#endif

namespace servedeck::gateway {

namespace asio = boost::asio;
using nlohmann::json;
using clock_type = std::chrono::steady_clock;

std::string_view route_path(Route r) {
  switch (r) {
    case Route::chat_completions: return "/v1/chat/completions";
    case Route::completions: return "/v1/completions";
    case Route::responses: return "/v1/responses";
  }
  return "/v1/chat/completions";
}

std::string_view upstream_path(Route r) {
  return r == Route::completions ? "/v1/completions" : "/v1/chat/completions";
}

namespace {

constexpr std::size_t k_max_engine_body = 64u * 1024 * 1024;  // a non-streaming engine answer, bytes
// note: far above what a client reading at token speed leaves queued (a few KiB), far below the
// server's max_pending_write_bytes (8 MiB) that closes a stuck client.
constexpr std::size_t k_high_water = 1024 * 1024;  // bytes queued for the client: pause the engine
constexpr std::size_t k_low_water = 256 * 1024;    // resume below this

double ms_since(clock_type::time_point t) {
  return std::chrono::duration<double, std::milli>(clock_type::now() - t).count();
}

int64_t usage_field(const std::optional<json>& usage, const char* key) {
  if (!usage || !usage->is_object()) return 0;
  auto it = usage->find(key);
  return it != usage->end() && it->is_number_integer() ? it->get<int64_t>() : 0;
}

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

class ProxyCall : public std::enable_shared_from_this<ProxyCall> {
 public:
  ProxyCall(ProxyShared& shared, ProxyJob job)
      : shared_(shared), job_(std::move(job)), strand_(asio::make_strand(*shared.upstream_ioc)), heartbeat_(strand_) {
    chat_ = job_.route != Route::completions;
    stream_ = job_.body.contains("stream") && job_.body["stream"].is_boolean() && job_.body["stream"].get<bool>();
    if (auto so = job_.body.find("stream_options"); so != job_.body.end() && so->is_object()) {
      auto iu = so->find("include_usage");
      include_usage_ = iu != so->end() && iu->is_boolean() && iu->get<bool>();
    }
    client_started_ = job_.client_stream_started;
    normalizer_.emplace(normalizer_options());
#ifdef SERVEDECK_HAVE_POLICIES
    capture_ = policies::capture_enabled(*job_.model);  // policy on AND SERVEDECK_CAPTURE=1
#endif
  }

  void start() {
    shared_.metrics->add_in_flight(1);
    auto self = shared_from_this();
    job_.res->on_disconnect([self] { asio::dispatch(self->strand_, [self] { self->on_client_gone(); }); });
    asio::dispatch(strand_, [self] { self->begin(); });
  }

 private:
  StreamNormalizer::Options normalizer_options() const {
    StreamNormalizer::Options o;
    o.model_id = job_.requested_id;
    o.include_usage = include_usage_;
    o.chat = chat_;
    o.id_seed = job_.requested_id + "/" + std::to_string(job_.start.time_since_epoch().count());
    return o;
  }

  void begin() {
    if (done_) return;
    engine_body_ = job_.body;
    engine_body_["model"] = job_.model->served_name;
    if (stream_) engine_body_["stream_options"] = json{{"include_usage", true}};  // for our log; stripped if not asked
    if (chat_) {
      clean_chat_request(engine_body_);
#ifdef SERVEDECK_HAVE_POLICIES
      policies::RequestContext rc;
      rc.model = job_.model;
      rc.requested_id = job_.requested_id;
      rc.preset = job_.preset;
      rc.count_repair = repair_counter();
      rc.reasoning_store = shared_.reasoning_store;
      policies::RequestPipeline rp(rc);
      if (rp.wants_prompt_tokens(engine_body_)) {
        // note: a conservative estimate (policies/min_output_tokens.hpp: message and tool bytes / 2
        // + 8 per message, an overcount) instead of a blocking /tokenize call on the request
        // path; overcounting can only make the raised budget smaller, never past the context.
        rc.prompt_tokens = policies::estimate_prompt_tokens(engine_body_);
        rc.prompt_tokens_estimated = true;
      }
      if (auto err = rp.apply(engine_body_)) return answer_local(400, *err, "invalid_request_error", "policy_rejected");
      response_ctx_ = std::make_unique<policies::ResponseContext>();
      response_ctx_->model = job_.model;
      response_ctx_->requested_id = job_.requested_id;
      response_ctx_->request = engine_body_;
      response_ctx_->count_repair = repair_counter();
      response_ctx_->reasoning_store = shared_.reasoning_store;
      if (stream_) stream_pipeline_.emplace(*response_ctx_);
#endif
    }
    if (stream_ && !client_started_) arm_heartbeat();
    send_upstream();
  }

#ifdef SERVEDECK_HAVE_POLICIES
  policies::RepairCounter repair_counter() {
    Metrics* m = shared_.metrics;
    return [m](std::string_view policy, std::string_view model) { m->count_repair(policy, model); };
  }
#endif

  void send_upstream() {
    UpstreamRequest req;
    req.host = job_.engine_host;
    req.port = job_.engine_port;
    req.target = std::string(upstream_path(job_.route));
    req.body = dump_json(engine_body_);
    req.connect_timeout_ms = job_.model->connect_timeout_ms;
    req.first_byte_timeout_ms = job_.model->first_byte_timeout_ms;
    req.max_gap_ms = job_.model->max_gap_ms;
    auto self = shared_from_this();
    UpstreamCallbacks cb;
    // Each callback pins the call on its own stack (`keep`): the std::function holding `self` may
    // be released (by the upstream ending, or the client's connection dropping on another
    // thread) while the callback still runs.
    cb.on_head = [self](int status, const std::map<std::string, std::string>&) { self->upstream_status_ = status; };
    cb.on_data = [self](std::string_view bytes) {
      auto keep = self;
      keep->on_upstream_data(bytes);
    };
    cb.on_end = [self](UpstreamFailure f, const std::string& detail) {
      auto keep = self;
      keep->on_upstream_end(f, detail);
    };
    cb.should_pause = [self] {
      auto keep = self;
      return keep->should_pause();
    };
    upstream_ = start_upstream(strand_, std::move(req), std::move(cb));
  }

  /// Backpressure: above k_high_water bytes queued for the client, stop reading the engine
  /// until the client took all but k_low_water.
  bool should_pause() {
    if (done_ || job_.res->queued_bytes() <= k_high_water) return false;
    auto self = shared_from_this();
    auto up = upstream_;
    job_.res->when_drained(k_low_water, [self, up] {
      asio::dispatch(self->strand_, [self, up] {
        if (!self->done_ && up) up->resume();
      });
    });
    return true;
  }

  // --- heartbeats while the engine has not produced its first output --------------------
  void arm_heartbeat() {
    if (shared_.heartbeat_ms <= 0) return;
    heartbeat_.expires_after(std::chrono::milliseconds(shared_.heartbeat_ms));
    heartbeat_.async_wait([self = shared_from_this()](boost::system::error_code ec) {
      if (ec || self->done_ || self->normalizer_->produced_output()) return;
      self->start_client_stream();
      self->write_client(sse::format_comment("waiting for the engine's first token"));
      self->arm_heartbeat();
    });
  }

  void start_client_stream() {
    if (client_started_) return;
    client_started_ = true;
    if (!job_.res->start_stream(200)) on_client_gone();
  }

  void write_client(std::string_view bytes) {
    if (bytes.empty() || done_) return;
    if (capture_ && captured_stream_.size() < k_max_engine_body) captured_stream_.append(bytes);
    if (!job_.res->write(bytes)) on_client_gone();
  }

  // --- upstream data --------------------------------------------------------------------
  void on_upstream_data(std::string_view bytes) {
    if (done_) return;
    if (upstream_status_ != 200 || !stream_) {
      if (engine_text_.size() + bytes.size() > k_max_engine_body)
        return fail(502, "the engine's answer exceeds " + std::to_string(k_max_engine_body) + " bytes",
                    "server_error", "engine_body_too_large", ErrorSource::servedeck);
      engine_text_.append(bytes);
      return;
    }
    const int attempt = attempt_;
    for (auto& ev : parser_.feed(bytes)) {
      handle_event(ev);
      if (done_ || attempt != attempt_) return;  // ended, or retried (G09): the rest is stale
    }
  }

  void handle_event(const sse::Event& ev) {
    if (ev.comment) return;
    if (ev.data == "[DONE]") return finish_stream();
    JsonParseError perr;
    json chunk = parse_json(ev.data, perr);
    if (chunk.is_discarded())
      return fail(502, "the engine sent a malformed event: " + perr.message, "server_error", "engine_bad_event",
                  ErrorSource::engine);
    if (chunk.is_object() && chunk.contains("error")) return on_engine_error(chunk["error"]);
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
    deliver(std::move(out));
  }

  /// Sends normalised output; a role-only prefix is held until the first real output.
  void deliver(std::string out) {
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

  void on_engine_error(const json& err) {
    if (!normalizer_->produced_output() && !retried_ && normalizer_->emitted_any()) {
      // G09: only the role chunk came before the error: retry once, transparently.
      retried_ = true;
      retrying_ = true;
      ++attempt_;  // the rest of this attempt's events are stale (the cancel lands later)
      upstream_->cancel();
      return;
    }
    if (!client_started_) {
      return fail(status_for_engine_error(err), engine_message(err), engine_type(err), engine_code(err),
                  ErrorSource::engine);
    }
    std::string out = held_;
    held_.clear();
    normalizer_->fail_with_engine_error(err, out);
    error_code_ = engine_code(err);
    end_stream(std::move(out));
  }

  static std::string engine_message(const json& err) {
    if (err.is_object() && err.contains("message") && err["message"].is_string()) return err["message"].get<std::string>();
    return err.is_string() ? err.get<std::string>() : dump_json(err);
  }
  static std::string engine_type(const json& err) {
    if (err.is_object() && err.contains("type") && err["type"].is_string()) return err["type"].get<std::string>();
    return "server_error";
  }
  static std::string engine_code(const json& err) {
    if (err.is_object() && err.contains("code")) {
      const auto& c = err["code"];
      if (c.is_string() && !c.get_ref<const std::string&>().empty()) return c.get<std::string>();
      if (c.is_number()) return dump_json(c);
    }
    return "engine_error";
  }

  void finish_stream() {
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
    if (normalizer_->finish(out) == StreamEnd::error) error_code_ = "empty_stream";
    end_stream(std::move(out));
  }

  void on_upstream_end(UpstreamFailure f, const std::string& detail) {
    if (retrying_) {
      retrying_ = false;
      parser_ = sse::Parser();
      normalizer_.emplace(normalizer_options());
      held_.clear();
      return send_upstream();
    }
    if (done_) return;
    if (f == UpstreamFailure::cancelled) return on_client_gone();
    if (f == UpstreamFailure::none || f == UpstreamFailure::closed) {
      if (upstream_status_ != 200) {
        if (f == UpstreamFailure::closed && upstream_status_ == 0)
          return fail(502, "the engine closed the connection without answering (" + detail + ")", "server_error",
                      "upstream_closed", ErrorSource::engine);
        return answer_engine_error_body();
      }
      if (!stream_) {
        if (f == UpstreamFailure::closed)
          return fail(502, "the engine closed the connection before its answer was complete (" + detail + ")",
                      "server_error", "upstream_closed", ErrorSource::engine);
        return answer_body();
      }
      if (auto last = parser_.finish()) {
        handle_event(*last);
        if (done_) return;
      }
      if (normalizer_->finish_seen()) return finish_stream();
      return fail(502, "the engine closed the stream before its finish chunk or [DONE] (" + detail + ")",
                  "server_error", "upstream_closed", ErrorSource::engine);
    }
    if (f == UpstreamFailure::connect_timeout || f == UpstreamFailure::first_byte_timeout ||
        f == UpstreamFailure::gap_timeout)
      return fail(504, detail, "timeout_error", std::string("upstream_") + std::string(to_string(f)),
                  ErrorSource::servedeck);
    if (f == UpstreamFailure::connect)
      return fail(502, "cannot reach the engine of model '" + job_.model->name + "': " + detail, "server_error",
                  "engine_unreachable", ErrorSource::servedeck);
    fail(502, detail, "server_error", "upstream_io", ErrorSource::servedeck);
  }

  /// The engine answered with a non-200 status: pass it on with source "engine".
  void answer_engine_error_body() {
    JsonParseError perr;
    json j = parse_json(engine_text_, perr);
    json err = j.is_object() && j.contains("error") ? j["error"] : json();
    std::string message = err.is_null() ? (engine_text_.empty() ? "the engine answered HTTP " + std::to_string(upstream_status_)
                                                                : engine_text_.substr(0, 2000))
                                        : engine_message(err);
    int status = upstream_status_ >= 400 && upstream_status_ <= 599 ? upstream_status_ : 502;
    fail(status, message, err.is_null() ? "server_error" : engine_type(err),
         err.is_null() ? "engine_http_" + std::to_string(upstream_status_) : engine_code(err), ErrorSource::engine);
  }

  /// A complete non-streaming answer from the engine.
  void answer_body() {
    JsonParseError perr;
    json body = parse_json(engine_text_, perr);
    if (body.is_discarded() || !body.is_object())
      return fail(502, "the engine's answer is not a JSON object: " + perr.message, "server_error", "engine_bad_body",
                  ErrorSource::engine);
    if (body.contains("error")) {
      const json err = body["error"];
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
    ttft_ms_ = ms_since(job_.start);
    done_ = true;
    if (capture_) captured_body_ = body;
    job_.res->send(200, "application/json", dump_json(body));
    record(200);
  }

  // --- endings ----------------------------------------------------------------------------
  /// An error: a real status when the client's stream has not started, else an error event.
  void fail(int status, const std::string& message, const std::string& type, const std::string& code,
            ErrorSource source) {
    if (done_) return;
    error_code_ = code;
    if (client_started_) {
      std::string out = held_;
      held_.clear();
      normalizer_->fail(message, type, code, source, out);
      return end_stream(std::move(out));
    }
    done_ = true;
    if (upstream_) upstream_->cancel();
    heartbeat_.cancel();
    job_.res->send(status, "application/json", dump_json(make_error(message, type, code, source)));
    record(status);
  }

  void answer_local(int status, const std::string& message, const std::string& type, const std::string& code) {
    fail(status, message, type, code, ErrorSource::servedeck);
  }

  void end_stream(std::string out) {
    if (done_) return;
    start_client_stream();
    write_client(out);
    done_ = true;
    heartbeat_.cancel();
    if (upstream_) upstream_->cancel();
    job_.res->end();
    usage_ = normalizer_->usage();
    record(200);
  }

  void on_client_gone() {
    if (done_) return;
    done_ = true;
    heartbeat_.cancel();
    if (upstream_) upstream_->cancel();
    usage_ = normalizer_->usage();
    error_code_ = "client_disconnected";
    record(499);  // nginx's "client closed request"
  }

  void record(int status) {
    shared_.metrics->add_in_flight(-1);
    job_.lease.reset();
    double total = ms_since(job_.start);
    state::RequestRecord r;
    r.time_ms = state::now_ms() - static_cast<int64_t>(total);
    r.route = std::string(route_path(job_.route));
    r.model = job_.model->name;
    r.alias = job_.requested_id;
    r.stream = stream_;
    r.status = status;
    r.prompt_tokens = usage_field(usage_, "prompt_tokens");
    r.completion_tokens = usage_field(usage_, "completion_tokens");
    if (r.completion_tokens == 0 && stream_) r.completion_tokens = normalizer_->output_chunks();
    r.ttft_ms = ttft_ms_.value_or(0);
    r.total_ms = total;
    double decode_ms = total - r.ttft_ms;
    if (r.completion_tokens > 1 && decode_ms > 0) r.decode_tok_s = (r.completion_tokens - 1) * 1000.0 / decode_ms;
    r.error_code = error_code_;
#ifdef SERVEDECK_HAVE_POLICIES
    if (capture_) {
      // Bodies go to the capture directory only (0600 files), never to the request log.
      json response = stream_ ? json{{"status", status}, {"sse", captured_stream_}}
                              : json{{"status", status}, {"body", captured_body_}};
      auto write = [model = job_.model, request = engine_body_, response = std::move(response)] {
        auto c = policies::capture_exchange(*model, request, response);
        if (c.error) std::fprintf(stderr, "servedeck: capture failed: %s\n", c.error->c_str());
      };
      if (!shared_.post_blocking || !shared_.post_blocking(write)) write();
    }
#endif
    auto& m = *shared_.metrics;
    m.count_request(r.model, status);
    if (!r.error_code.empty()) m.count_error(r.model, r.error_code);
    if (ttft_ms_ && error_code_.empty()) m.observe_ttft(r.model, *ttft_ms_ / 1000.0);
    if (r.decode_tok_s > 0 && error_code_.empty()) m.observe_decode_rate(r.model, r.decode_tok_s);
    write_log(shared_, std::move(r));
  }

 public:
  static void write_log(ProxyShared& shared, state::RequestRecord r) {
    state::Store* store = shared.store;
    if (!store) return;
    auto job = [store, r = std::move(r)] {
      try {
        store->add_request(r);
      } catch (const std::exception&) {
        // The log could not be written (disk full, locked): the client's answer stands.
      }
    };
    if (!shared.post_blocking || !shared.post_blocking(job)) job();
  }

 private:
  ProxyShared& shared_;
  ProxyJob job_;
  asio::strand<asio::io_context::executor_type> strand_;
  asio::steady_timer heartbeat_;
  std::shared_ptr<UpstreamCall> upstream_;
  json engine_body_;
  std::string engine_text_;       // non-streaming or error body from the engine
  sse::Parser parser_;
  std::optional<StreamNormalizer> normalizer_;
#ifdef SERVEDECK_HAVE_POLICIES
  std::unique_ptr<policies::ResponseContext> response_ctx_;
  std::optional<policies::StreamPipeline> stream_pipeline_;
#endif
  std::string held_;              // role-only output not yet sent (G09)
  std::optional<json> usage_;
  std::optional<double> ttft_ms_;
  std::string error_code_;
  int upstream_status_ = 0;
  bool chat_ = true;
  bool stream_ = false;
  bool include_usage_ = false;
  bool client_started_ = false;
  bool retried_ = false;
  bool retrying_ = false;
  int attempt_ = 0;
  bool done_ = false;
  bool capture_ = false;            // policies/capture.hpp: policy on and SERVEDECK_CAPTURE=1
  std::string captured_stream_;     // SSE bytes sent to the client (capture only), bounded
  json captured_body_;              // non-streaming body sent to the client (capture only)
};

}  // namespace

void start_proxy(ProxyShared& shared, ProxyJob job) {
  std::make_shared<ProxyCall>(shared, std::move(job))->start();
}

void record_local_answer(ProxyShared& shared, Route route, const std::string& model, const std::string& alias,
                         bool stream, int status, const std::string& error_code, clock_type::time_point start) {
  double total = ms_since(start);
  state::RequestRecord r;
  r.time_ms = state::now_ms() - static_cast<int64_t>(total);
  r.route = std::string(route_path(route));
  r.model = model;
  r.alias = alias;
  r.stream = stream;
  r.status = status;
  r.total_ms = total;
  r.error_code = error_code;
  if (shared.metrics) {
    shared.metrics->count_request(model, status);
    if (!error_code.empty()) shared.metrics->count_error(model, error_code);
  }
  ProxyCall::write_log(shared, std::move(r));
}

}  // namespace servedeck::gateway
