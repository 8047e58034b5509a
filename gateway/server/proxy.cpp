// Implementation of gateway/server/proxy.hpp: the routes' paths, start_proxy and
// record_local_answer, and the life of one ProxyCall (proxy_internal.hpp): start, the policy
// pipeline on the request, the upstream request, backpressure, heartbeats, writes to the
// client, the endings and the request-log row. Reading the engine's answer is in
// proxy_engine_answer.cpp.
#include "gateway/server/proxy.hpp"

#include <utility>  // before Boost.Asio: boost 1.74 awaitable.hpp needs std::exchange

#include <cstdio>

#include "gateway/server/request_notes.hpp"
#include "gateway/server/engine_tokenize.hpp"
#include "gateway/server/proxy_internal.hpp"
#include "gateway/server/request_body.hpp"

namespace servedeck::gateway {

std::string_view route_path(Route r) {
  switch (r) {
    case Route::chat_completions: return "/v1/chat/completions";
    case Route::completions: return "/v1/completions";
    case Route::responses: return "/v1/responses";
    case Route::messages: return "/v1/messages";
  }
  return "/v1/chat/completions";
}

std::string_view upstream_path(Route r) {
  return r == Route::completions ? "/v1/completions" : "/v1/chat/completions";
}

namespace {

// note: far above what a client reading at token speed leaves queued (a few KiB), far below the
// server's max_pending_write_bytes (8 MiB) that closes a stuck client.
constexpr std::size_t k_high_water = 1024 * 1024;  // bytes queued for the client: pause the engine
constexpr std::size_t k_low_water = 256 * 1024;    // resume below this

int64_t usage_field(const std::optional<json>& usage, const char* key) {
  if (!usage || !usage->is_object()) return 0;
  auto it = usage->find(key);
  return it != usage->end() && it->is_number_integer() ? it->get<int64_t>() : 0;
}

}  // namespace

namespace detail {

ProxyCall::ProxyCall(ProxyShared& shared, ProxyJob job)
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

void ProxyCall::start() {
  shared_.metrics->add_in_flight(1);
  auto self = shared_from_this();
  job_.res->on_disconnect([self] { asio::dispatch(self->strand_, [self] { self->on_client_gone(); }); });
  asio::dispatch(strand_, [self] { self->begin(); });
}

StreamNormalizer::Options ProxyCall::normalizer_options() const {
  StreamNormalizer::Options o;
  o.model_id = job_.requested_id;
  o.include_usage = include_usage_;
  o.chat = chat_;
  o.id_seed = job_.requested_id + "/" + std::to_string(job_.start.time_since_epoch().count());
  o.prompt_tokens_estimate = prompt_estimate_;
  return o;
}

void ProxyCall::begin() {
  if (done_) return;
  engine_body_ = job_.body;
  engine_body_["model"] = job_.model->served_name;
  if (stream_) engine_body_["stream_options"] = json{{"include_usage", true}};  // for our log; stripped if not asked
  if (chat_) {
    clean_chat_request(engine_body_);
#ifdef SERVEDECK_HAVE_POLICIES
    request_ctx_ = std::make_unique<policies::RequestContext>();
    auto& rc = *request_ctx_;
    rc.model = job_.model;
    rc.requested_id = job_.requested_id;
    rc.preset = job_.preset;
    rc.count_repair = repair_counter();
    rc.reasoning_store = shared_.reasoning_store;
    policies::RequestPipeline rp(rc);
    if (rp.wants_prompt_tokens(engine_body_)) {
      if (engine_tokenizes_chat(*job_.model)) {
        // The engine's own template and tokenizer count the prompt (fit_output_budget lowers a
        // budget by it); on any failure the estimate below stands in.
        auto self = shared_from_this();
        count_chat_tokens(strand_, job_.engine_host, job_.engine_port, *job_.model, engine_body_, k_tokenize_timeout_ms,
                          [self](TokenCount c) { self->apply_request_policies(std::move(c)); });
        return;
      }
      return apply_request_policies(TokenCount{std::nullopt, "the engine has no chat /tokenize"});
    }
    return apply_request_policies(TokenCount{std::nullopt, ""});
#endif
  }
  send_prepared();
}

#ifdef SERVEDECK_HAVE_POLICIES
void ProxyCall::apply_request_policies(TokenCount count) {
  if (done_) return;
  auto& rc = *request_ctx_;
  policies::RequestPipeline rp(rc);
  if (count.tokens) {
    rc.prompt_tokens = count.tokens;
    rc.prompt_tokens_estimated = false;
  } else if (rp.wants_prompt_tokens(engine_body_)) {
    // note: a conservative estimate (policies/min_output_tokens.hpp: message and tool bytes / 2
    // + 8 per message, an overcount): a raised budget can only come out smaller, a lowered one
    // only lower, never past the context.
    rc.prompt_tokens = policies::estimate_prompt_tokens(engine_body_);
    rc.prompt_tokens_estimated = true;
  }
  if (auto err = rp.apply(engine_body_)) return answer_local(400, *err, "invalid_request_error", "policy_rejected");
  for (auto& h : rc.response_headers) client_headers_.push_back(std::move(h));
  response_ctx_ = std::make_unique<policies::ResponseContext>();
  response_ctx_->model = job_.model;
  response_ctx_->requested_id = job_.requested_id;
  response_ctx_->request = engine_body_;
  response_ctx_->count_repair = repair_counter();
  response_ctx_->reasoning_store = shared_.reasoning_store;
  if (stream_) stream_pipeline_.emplace(*response_ctx_);
  send_prepared();
}
#endif

void ProxyCall::send_prepared() {
  // G12: the prompt as the engine gets it, estimated once for a usage the engine may not report
  // (a byte count, no tokenizer on the request path); the normaliser is fresh, nothing fed yet.
  prompt_estimate_ = estimate_request_tokens(engine_body_);
  normalizer_.emplace(normalizer_options());
  if (stream_) arm_heartbeat(std::chrono::milliseconds(shared_.heartbeat_ms));
  send_upstream();
}

#ifdef SERVEDECK_HAVE_POLICIES
policies::RepairCounter ProxyCall::repair_counter() {
  Metrics* m = shared_.metrics;
  return [m](std::string_view policy, std::string_view model) { m->count_repair(policy, model); };
}
#endif

void ProxyCall::send_upstream() {
  UpstreamRequest req;
  req.host = job_.engine_host;
  req.port = job_.engine_port;
  req.target = std::string(upstream_path(job_.route));
  req.body = dump_safe(engine_body_);
  req.connect_timeout_ms = job_.model->connect_timeout_ms;
  req.first_byte_timeout_ms = job_.model->first_byte_timeout_ms;
  req.max_gap_ms = job_.model->max_gap_ms;
  // A non-streamed answer arrives whole at its end: its own total deadline, not the first byte's.
  if (!stream_) req.total_timeout_ms = job_.model->request_timeout_s * 1000;
  upstream_ended_ = false;
  auto self = shared_from_this();
  UpstreamCallbacks cb;
  // Each callback pins the call on its own stack (`keep`): the std::function holding `self` may
  // be released (by the upstream ending, or the client's connection dropping on another
  // thread) while the callback still runs.
  cb.on_head = [self](int status, const std::map<std::string, std::string>& headers) {
    auto keep = self;
    keep->on_upstream_head(status, headers);
  };
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
  cb.made_progress = [self] {
    auto keep = self;
    return std::exchange(keep->progressed_, false);
  };
  upstream_ = start_upstream(strand_, std::move(req), std::move(cb));
}

bool ProxyCall::should_pause() {
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

void ProxyCall::arm_heartbeat(std::chrono::milliseconds after) {
  if (shared_.heartbeat_ms <= 0) return;
  heartbeat_.expires_after(after);
  heartbeat_.async_wait([self = shared_from_this()](boost::system::error_code ec) {
    if (!ec) self->on_heartbeat();
  });
}

void ProxyCall::on_heartbeat() {
  if (done_) return;
  const auto period = std::chrono::milliseconds(shared_.heartbeat_ms);
  if (client_started_) {
    // note: one timer per call, re-armed for the rest of the period instead of on every write.
    auto idle = std::chrono::duration_cast<std::chrono::milliseconds>(clock_type::now() - last_write_);
    if (idle < period) return arm_heartbeat(period - idle);
  } else {
    start_client_stream();  // no output yet (a long prefill): later failures become error events
  }
  write_client(sse::format_comment(normalizer_->produced_output() ? "waiting for the engine's next event"
                                                                  : "waiting for the engine's first token"));
  if (!done_) arm_heartbeat(period);
}

void ProxyCall::start_client_stream() {
  if (client_started_) return;
  client_started_ = true;
  if (!job_.res->start_stream(200, "text/event-stream", client_headers_)) on_client_gone();
}

void ProxyCall::write_client(std::string_view bytes) {
  if (bytes.empty() || done_) return;
  if (capture_ && captured_stream_.size() < k_max_engine_body) captured_stream_.append(bytes);
  last_write_ = clock_type::now();
  if (!job_.res->write(bytes)) on_client_gone();
}

void ProxyCall::fail(int status, const std::string& message, const std::string& type, const std::string& code,
                     ErrorSource source, http::Headers extra_headers) {
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
  http::Headers headers = client_headers_;
  for (auto& h : extra_headers) headers.push_back(std::move(h));
  job_.res->send(status, "application/json", dump_safe(make_error(message, type, code, source, error_param_)), std::move(headers));
  record(status);
}

void ProxyCall::answer_local(int status, const std::string& message, const std::string& type, const std::string& code) {
  fail(status, message, type, code, ErrorSource::servedeck);
}

void ProxyCall::end_stream(std::string out) {
  if (done_) return;
  start_client_stream();
  write_client(out);
  if (done_) return;  // the client went away on that write: on_client_gone recorded the 499
  done_ = true;
  heartbeat_.cancel();
  if (upstream_) upstream_->cancel();
  job_.res->end();
  usage_ = normalizer_->usage();
  record(200);
}

void ProxyCall::on_client_gone() {
  if (done_) return;
  done_ = true;
  heartbeat_.cancel();
  if (upstream_) upstream_->cancel();
  usage_ = normalizer_->usage();
  error_code_ = "client_disconnected";
  record(499);  // nginx's "client closed request"
}

void ProxyCall::record(int status) {
  if (recorded_) return;
  recorded_ = true;
  if (const auto refused = job_.res->refusal(); refused.status != 0) {  // a bridge answered its own error
    status = refused.status;
    if (error_code_.empty()) error_code_ = refused.error_code;
  }
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

void ProxyCall::write_log(ProxyShared& shared, state::RequestRecord r) {
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

}  // namespace detail

using detail::ms_since;
using detail::ProxyCall;

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
  r.alias = quoted_client_id(alias);  // a client's unknown id: bounded before it reaches the log
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
