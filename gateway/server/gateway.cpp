#include "gateway/server/gateway.hpp"

#include <utility>  // before Boost.Asio: boost 1.74 awaitable.hpp needs std::exchange

#include <atomic>
#include <map>
#include <mutex>
#include <thread>

#include <boost/asio.hpp>

#include "common/json_limits.hpp"
#include "common/openai_error.hpp"
#include "common/sse.hpp"
#include "gateway/anthropic/messages_responder.hpp"
#include "gateway/server/access.hpp"
#include "gateway/server/messages_route.hpp"
#include "gateway/server/metrics.hpp"
#include "gateway/server/models_route.hpp"
#include "gateway/server/proxy.hpp"
#include "gateway/server/request_body.hpp"
#include "gateway/server/request_notes.hpp"
#include "gateway/server/stream_normalizer.hpp"
#include "gateway/responses/request_translator.hpp"
#include "gateway/responses/responses_responder.hpp"
#include <iostream>

namespace servedeck::gateway {

namespace asio = boost::asio;
using nlohmann::json;
using clock_type = std::chrono::steady_clock;

namespace {

AccessRules access_rules(const registry::Registry& reg, const GatewayOptions& opt) {
  return {reg.server.api_keys, opt.admin_token, opt.admin_token_path, opt.host, reg.server.allowed_hosts};
}

void send_json(http::Responder& res, int status, const json& body, http::Headers extra = {}) {
  res.send(status, "application/json", dump_safe(body), std::move(extra));
}

}  // namespace

/// A request waiting for its model to be switched in (switch_on_request).
struct Waiter {
  Waiter(asio::io_context& ioc) : strand(asio::make_strand(ioc)), timeout(strand), heartbeat(strand) {}
  asio::strand<asio::io_context::executor_type> strand;
  asio::steady_timer timeout;
  asio::steady_timer heartbeat;
  ProxyJob job;
  bool stream = false;
  bool heartbeat_started = false;  // the client already has a 200 stream with heartbeats
  bool done = false;
};

struct Gateway::Impl {
  Impl(const registry::Registry& r, state::Store& s, SlotControl& sl, GatewayOptions o)
      : reg(r), store(s), slots(sl), opt(std::move(o)) {}

  const registry::Registry& reg;
  state::Store& store;
  SlotControl& slots;
  GatewayOptions opt;
  Metrics metrics;
  asio::io_context upstream_ioc;
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> work;
  std::vector<std::thread> upstream_threads;
  std::unique_ptr<http::Server> server;
  std::map<std::pair<std::string, std::string>, http::Handler> routes;
  ProxyShared shared;
  MessagesRoutes messages;  // /v1/messages and count_tokens (messages_route.hpp)
  std::atomic<bool> recovering{false};  // set_recovering()
  std::mutex queue_mu;
  std::map<std::string, int> queued;  // by base model name
  /// Guards SlotControl callbacks that may run after the Gateway stopped (the supervisor can
  /// outlive it): they run only while `alive`, holding `mu`.
  struct Guard {
    std::mutex mu;
    bool alive = true;
  };
  std::shared_ptr<Guard> guard = std::make_shared<Guard>();

  void handle(http::Request req, std::shared_ptr<http::Responder> res);
  void handle_completion(Route route, http::Request& req, std::shared_ptr<http::Responder> res);
  /// Everything after the JSON parse: resolve the model, admit, proxy (or 409 / queue).
  void handle_completion_body(Route route, json body, std::shared_ptr<http::Responder> res,
                              clock_type::time_point t0);
  /// POST /v1/responses: translate onto a chat completion, answer through ResponsesResponder.
  void handle_responses(http::Request& req, std::shared_ptr<http::Responder> res);
  void handle_health(http::Responder& res);
  void enqueue(ProxyJob job, bool stream);
  void release_waiter(const std::shared_ptr<Waiter>& w);
  void on_switch_done(std::shared_ptr<Waiter> w, Lease lease, std::string error);
  void waiter_fail(const std::shared_ptr<Waiter>& w, int status, const std::string& message, const std::string& code);
  void waiter_heartbeat(const std::shared_ptr<Waiter>& w);
};

Gateway::Gateway(const registry::Registry& reg, state::Store& store, SlotControl& slots, GatewayOptions opt)
    : impl_(std::make_unique<Impl>(reg, store, slots, std::move(opt))) {
  auto& im = *impl_;
  http::ServerOptions so;
  so.host = im.opt.host;
  so.port = im.opt.port;
  so.threads = im.opt.threads;
  so.max_connections = im.opt.max_connections;
  so.max_body_bytes = reg.server.max_body_bytes;
  so.head_check = [rules = access_rules(reg, im.opt)](const http::Request& head) {
    auto refusal = check_access(rules, head);
    // Anthropic clients read Anthropic's error envelope on their routes.
    if (refusal && is_messages_path(head.path))
      refusal->body = dump_safe(anthropic::error_from_openai(refusal->status, refusal->body));
    return refusal;
  };
  Impl* p = impl_.get();
  im.server = std::make_unique<http::Server>(so, [p](http::Request req, std::shared_ptr<http::Responder> res) {
    p->handle(std::move(req), std::move(res));
  });
  im.shared.upstream_ioc = &im.upstream_ioc;
  im.shared.metrics = &im.metrics;
  im.shared.store = &im.store;
  im.shared.heartbeat_ms = im.opt.heartbeat_ms;
  im.shared.retry_after_s = im.opt.retry_after_s;
  im.shared.slots = &im.slots;
  http::Server* srv = im.server.get();
  im.shared.post_blocking = [srv](std::function<void()> fn) { return srv->post_blocking(std::move(fn)); };
  im.messages.reg = &im.reg;
  im.messages.slots = &im.slots;
  im.messages.shared = &im.shared;
  im.messages.run_chat = [p](json chat, std::shared_ptr<http::Responder> res, clock_type::time_point t0) {
    p->handle_completion_body(Route::messages, std::move(chat), std::move(res), t0);
  };
}

Gateway::~Gateway() { stop(); }

void Gateway::add_route(std::string method, std::string path, http::Handler handler) {
  if (plane_of(path) != Plane::admin) throw std::invalid_argument("add_route: " + path + " is not under /admin/");
  impl_->routes[{std::move(method), std::move(path)}] = std::move(handler);
}

void Gateway::start() {
  auto& im = *impl_;
  if (!im.upstream_threads.empty()) return;
  im.work.emplace(im.upstream_ioc.get_executor());
  for (int i = 0; i < std::max(1, im.opt.threads); ++i)
    im.upstream_threads.emplace_back([&im] {
      // A handler that throws ends that handler's call only: the thread logs it and runs on.
      for (;;) {
        try {
          im.upstream_ioc.run();
          return;
        } catch (const std::exception& e) {
          std::cerr << "servedeck: upstream thread: a handler failed (the thread continues): " << e.what() << "\n";
        } catch (...) {
          std::cerr << "servedeck: upstream thread: a handler failed (the thread continues)\n";
        }
      }
    });
  im.server->start();
}

int Gateway::port() const { return impl_->server->port(); }

void Gateway::stop() {
  auto& im = *impl_;
  {
    std::lock_guard lk(im.guard->mu);
    im.guard->alive = false;
  }
  im.server->stop();  // closes every client connection: their calls cancel their upstreams
  im.work.reset();
  // The cancels are queued on the calls' strands: let them run before stopping the upstream
  // threads. Stopping at once dropped them, so a call cut mid-stream and its upstream kept each
  // other alive (a leak), its lease was never released and the engine kept generating. Once
  // nothing is pending, run() returns and the io_context reports stopped(); the wait is bounded
  // so a call that cannot end does not hold up shutdown.
  if (!im.upstream_threads.empty()) {
    auto deadline = clock_type::now() + std::chrono::seconds(2);
    while (!im.upstream_ioc.stopped() && clock_type::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  im.upstream_ioc.stop();
  for (auto& t : im.upstream_threads)
    if (t.joinable()) t.join();
  im.upstream_threads.clear();
}

Metrics& Gateway::metrics() { return impl_->metrics; }

void Gateway::set_reasoning_store(policies::ReasoningStore* store) { impl_->shared.reasoning_store = store; }

void Gateway::set_recovering(bool recovering) { impl_->recovering = recovering; }

bool Gateway::post_blocking(std::function<void()> fn) { return impl_->server->post_blocking(std::move(fn)); }

void Gateway::Impl::handle(http::Request req, std::shared_ptr<http::Responder> res) {
  // Host, Origin, credentials and Content-Type were checked from the head (check_access).
  if (req.method == "POST" && req.path == "/v1/chat/completions")
    return handle_completion(Route::chat_completions, req, std::move(res));
  if (req.method == "POST" && req.path == "/v1/completions") return handle_completion(Route::completions, req, std::move(res));
  if (req.method == "POST" && req.path == "/v1/responses") return handle_responses(req, std::move(res));
  if (req.method == "POST" && req.path == "/v1/messages") return handle_messages(messages, req, std::move(res));
  if (req.method == "POST" && req.path == "/v1/messages/count_tokens")
    return handle_count_tokens(messages, req, std::move(res));
  // HEAD is answered as GET on the read-only routes; the server sends the head only (RFC 9110 9.3.2).
  const bool get = req.method == "GET" || req.method == "HEAD";
  if (get && req.path == "/v1/models") return handle_models(reg, *res);
  if (get && req.path.rfind("/v1/models/", 0) == 0) return handle_model(reg, req, *res);
  if (get && req.path == "/health") return handle_health(*res);
  if (get && req.path == "/metrics")
    return res->send(200, "text/plain; version=0.0.4", metrics.render(slots.snapshot()));
  if (auto it = routes.find({req.method, req.path}); it != routes.end()) return it->second(std::move(req), std::move(res));
  std::string allowed;  // the admin methods registered on this path
  for (const auto& [key, h] : routes)
    if (key.second == req.path) allowed += (allowed.empty() ? "" : ", ") + key.first;
  if (!allowed.empty())
    return http::send_error(*res, 405, "method " + req.method + " not allowed on " + req.path + "; expected " + allowed,
                            "invalid_request_error", "method_not_allowed", false, {{"Allow", allowed}});
  const bool post_route = req.path == "/v1/chat/completions" || req.path == "/v1/completions" ||
                          req.path == "/v1/responses" || is_messages_path(req.path);
  const bool get_route = req.path == "/v1/models" || req.path == "/health" || req.path == "/metrics";
  const std::string not_allowed =
      "method " + req.method + " not allowed on " + req.path + "; expected " + (post_route ? "POST" : "GET");
  if (req.path == "/v1/messages" || req.path == "/v1/messages/count_tokens")
    return send_messages_error(*res, 405, not_allowed, {{"Allow", "POST"}});
  if ((post_route && !is_messages_path(req.path)) || get_route)
    return http::send_error(*res, 405, not_allowed, "invalid_request_error", "method_not_allowed", false,
                            {{"Allow", post_route ? "POST" : "GET, HEAD"}});
  // A client pointed at an API the gateway does not serve shows up in /metrics by path.
  metrics.count_unserved(req.path);
  if (is_messages_path(req.path)) return send_messages_error(*res, 404, "no route " + req.method + " " + req.path);
  http::send_error(*res, 404, "no route " + req.method + " " + req.path, "not_found_error", "route_not_found");
}

void Gateway::Impl::handle_health(http::Responder& res) {
  auto snap = slots.snapshot();
  json j{{"status", "ok"},
         {"slot", {{"state", std::string(to_string(snap.state))}, {"model", snap.model}, {"in_flight", snap.in_flight}}}};
  if (!snap.switching_to.empty()) j["slot"]["switching_to"] = snap.switching_to;
  if (recovering) j["recovering"] = true;
  send_json(res, 200, j);
}

void Gateway::Impl::handle_completion(Route route, http::Request& req, std::shared_ptr<http::Responder> res) {
  auto t0 = clock_type::now();
  auto local = [&](int status, const std::string& model, const std::string& alias, bool stream,
                   const std::string& message, const char* type, const char* code, http::Headers extra = {}) {
    http::send_error(*res, status, message, type, code, false, std::move(extra));
    record_local_answer(shared, route, model, alias, stream, status, code, t0);
  };
  JsonError perr;
  json body = parse_untrusted(req.body, &perr);
  if (body.is_discarded()) return local(400, "", "", false, perr.message, "invalid_request_error", "invalid_json");
  if (!body.is_object()) return local(400, "", "", false, "the request body must be a JSON object", "invalid_request_error", "invalid_body");
  handle_completion_body(route, std::move(body), std::move(res), t0);
}

void Gateway::Impl::handle_responses(http::Request& req, std::shared_ptr<http::Responder> res) {
  auto t0 = clock_type::now();
  JsonError perr;
  json body = parse_untrusted(req.body, &perr);
  const bool stream = body.is_object() && body.contains("stream") && body["stream"].is_boolean() && body["stream"].get<bool>();
  const std::string id = body.is_object() && body.contains("model") && body["model"].is_string() ? body["model"].get<std::string>() : "";
  auto local = [&](int status, const std::string& message, const char* code) {
    http::send_error(*res, status, message, "invalid_request_error", code);
    record_local_answer(shared, Route::responses, "", id, stream, status, code, t0);
  };
  if (body.is_discarded()) return local(400, perr.message, "invalid_json");
  json previous;
  const json* prev = nullptr;
  if (body.is_object() && body.contains("previous_response_id") && body["previous_response_id"].is_string()) {
    const std::string pid = body["previous_response_id"].get<std::string>();
    std::optional<json> doc;
    try {
      doc = store.get_document("responses", pid);
    } catch (const std::exception&) {
      doc.reset();
    }
    if (!doc || !doc->contains("messages"))
      return local(404, "previous response '" + quoted_client_id(pid) + "' not found (it was not stored with store=true, or has expired)",
                   "previous_response_not_found");
    previous = (*doc)["messages"];
    prev = &previous;
  }
  auto translated = std::make_shared<responses::TranslatedRequest>();
  if (auto err = responses::translate_request(body, prev, *translated)) return local(400, *err, "invalid_responses_request");
  log_request_notes("/v1/responses", id, translated->warnings);
  state::Store* st = &store;
  auto post = shared.post_blocking;
  // note: a stored turn expires server.responses_retention_s after it was written (0: nothing is
  // stored) and the Janitor deletes it then; previous_response_id past that is a 404. A request
  // with store: false is never written (ResponsesResponder checks TranslatedRequest::store).
  const int64_t retention_ms = reg.server.responses_retention_s * 1000;
  responses::StoreTurn store_turn;
  if (retention_ms > 0)
    store_turn = [st, post, retention_ms](const std::string& response_id, const json& messages) {
      auto write = [st, response_id, messages, retention_ms] {
        try {
          st->put_document("responses", response_id, json{{"messages", messages}}, state::now_ms() + retention_ms);
        } catch (const std::exception& e) {
          std::cerr << "servedeck: could not store response " << response_id << ": " << e.what() << "\n";
        }
      };
      if (!post || !post(write)) write();
    };
  auto adapter = std::make_shared<responses::ResponsesResponder>(res, translated, id, std::move(store_turn));
  handle_completion_body(Route::responses, translated->chat, std::move(adapter), t0);
}

void Gateway::Impl::handle_completion_body(Route route, json body, std::shared_ptr<http::Responder> res,
                                           clock_type::time_point t0) {
  auto local = [&](int status, const std::string& model, const std::string& alias, bool stream,
                   const std::string& message, const char* type, const char* code, http::Headers extra = {}) {
    http::send_error(*res, status, message, type, code, false, std::move(extra));
    record_local_answer(shared, route, model, alias, stream, status, code, t0);
  };
  bool stream = body.contains("stream") && body["stream"].is_boolean() && body["stream"].get<bool>();
  if (!body.contains("model") || !body["model"].is_string())
    return local(400, "", "", stream,
                 std::string("the request needs a string `model`, got ") + (body.contains("model") ? body["model"].type_name() : "none"),
                 "invalid_request_error", "missing_model");
  std::string id = body["model"].get<std::string>();
  const registry::ModelEntry* entry = reg.find_by_id(id);
  if (!entry) {
    std::string known;
    for (const auto& m : reg.models)
      for (const auto& i : m.all_ids()) known += (known.empty() ? "" : ", ") + i;
    return local(404, "", id, stream, "model '" + quoted_client_id(id) + "' is not configured; configured ids: " + known,
                 "invalid_request_error", "model_not_found");
  }
  if (route != Route::completions && (!body.contains("messages") || !body["messages"].is_array()))
    return local(400, entry->name, id, stream,
                 std::string("a chat completion needs a `messages` array, got ") +
                     (body.contains("messages") ? body["messages"].type_name() : "none"),
                 "invalid_request_error", "missing_messages");
  if (route == Route::completions && !body.contains("prompt"))
    return local(400, entry->name, id, stream, "a completion needs a `prompt`", "invalid_request_error", "missing_prompt");

  if (recovering)
    return local(503, entry->name, id, stream,
                 "the daemon has just started and is adopting or reaping the engine a previous daemon left; "
                 "model '" + entry->name + "' can be asked for once that is done",
                 "overloaded_error", "slot_recovering", {{"Retry-After", std::to_string(opt.retry_after_s)}});
  ProxyJob job;
  job.route = route;
  job.model = entry;
  job.preset = reg.find_preset(id);
  job.requested_id = id;
  job.body = std::move(body);
  job.res = res;
  job.start = t0;
  if (Lease lease = slots.acquire(entry->name)) {
    auto snap = slots.snapshot();
    job.lease = std::move(lease);
    job.engine_host = snap.host;
    job.engine_port = snap.port;
    return start_proxy(shared, std::move(job));
  }
  auto snap = slots.snapshot();
  std::string retry = std::to_string(opt.retry_after_s);
  // The model is being drained by a switch (or a stop): it is going away, and a queued request
  // would only switch it straight back. Say so, and what comes next.
  if (snap.model == entry->name && (snap.draining || snap.state == SlotState::stopping))
    return local(503, entry->name, id, stream,
                 "model '" + entry->name + "' is draining: " +
                     (snap.switching_to.empty() ? std::string("the slot is being stopped")
                                                : "the slot is switching to '" + snap.switching_to + "'") +
                     "; in-flight requests finish, new ones are refused until the switch ends",
                 "overloaded_error", "model_draining", {{"Retry-After", retry}});
  if (snap.model == entry->name && snap.state == SlotState::unhealthy)
    return local(503, entry->name, id, stream,
                 "model '" + entry->name + "' is unhealthy: " + snap.last_error.substr(0, snap.last_error.find('\n')),
                 "overloaded_error", "model_unhealthy", {{"Retry-After", retry}});
  if (entry->switch_on_request) return enqueue(std::move(job), stream);
  if (snap.model == entry->name && (snap.state == SlotState::preflight || snap.state == SlotState::starting))
    return local(503, entry->name, id, stream, "model '" + entry->name + "' is loading (" + std::string(to_string(snap.state)) + ")",
                 "overloaded_error", "model_loading", {{"Retry-After", retry}});
  if (snap.model == entry->name && snap.state == SlotState::failed) {
    // The slot failed on this very model: say so with the reason, not "the running model is it".
    std::string reason = snap.last_error.substr(0, snap.last_error.find('\n'));
    if (reason.empty()) reason = "no reason recorded";
    return local(409, entry->name, id, stream,
                 "model '" + entry->name + "' (requested as '" + id + "') is not running: its slot is failed: " +
                     reason + ". Inspect with: servedeck status; retry with: servedeck switch " + entry->name,
                 "invalid_request_error", "model_not_running");
  }
  // A switch to this very model that preflight refused before stopping the running one: the
  // request is answered with that reason (the refused checks, as `switch` printed them).
  std::string refused;
  if (!snap.refused_model.empty() && snap.refused_model == entry->name && !snap.refusal.empty()) {
    std::string reasons = snap.refusal;
    for (auto p = reasons.find('\n'); p != std::string::npos; p = reasons.find('\n', p)) reasons.replace(p, 1, "; ");
    refused = ": its last switch was refused by preflight: " + reasons;
  }
  std::string running;
  if (snap.model.empty() || snap.state == SlotState::stopped)
    running = "no model is running";
  else if (snap.state == SlotState::failed)
    running = "the slot is failed (last model '" + snap.model + "')";
  else
    running = "the running model is '" + snap.model + "' (" + std::string(to_string(snap.state)) + ")";
  local(409, entry->name, id, stream,
        "model '" + entry->name + "' (requested as '" + id + "') is not running" + refused + "; " + running +
            ". Switch with: servedeck switch " + entry->name,
        "invalid_request_error", "model_not_running");
}

void Gateway::Impl::enqueue(ProxyJob job, bool stream) {
  const registry::ModelEntry* entry = job.model;
  {
    std::lock_guard lk(queue_mu);
    int& n = queued[entry->name];
    if (n >= entry->queue_max) {
      http::send_error(*job.res, 503,
                       "the queue for model '" + entry->name + "' is full (" + std::to_string(entry->queue_max) +
                           " waiting)",
                       "overloaded_error", "queue_full", false, {{"Retry-After", std::to_string(opt.retry_after_s)}});
      record_local_answer(shared, job.route, entry->name, job.requested_id, stream, 503, "queue_full", job.start);
      return;
    }
    ++n;
  }
  metrics.add_queued(1);
  auto w = std::make_shared<Waiter>(upstream_ioc);
  w->job = std::move(job);
  w->stream = stream;
  Impl* self = this;
  w->job.res->on_disconnect([self, w] {
    asio::dispatch(w->strand, [self, w] {
      if (w->done) return;
      self->release_waiter(w);
      record_local_answer(self->shared, w->job.route, w->job.model->name, w->job.requested_id, w->stream, 499,
                          "client_disconnected", w->job.start);
    });
  });
  asio::dispatch(w->strand, [self, w] {
    w->timeout.expires_after(std::chrono::seconds(w->job.model->queue_timeout_s));
    w->timeout.async_wait([self, w](boost::system::error_code ec) {
      if (ec || w->done) return;
      self->waiter_fail(w, 503,
                        "model '" + w->job.model->name + "' did not become ready within " +
                            std::to_string(w->job.model->queue_timeout_s) + " s (queue_timeout_s)",
                        "queue_timeout");
    });
    if (w->stream) self->waiter_heartbeat(w);
  });
  // note: the callback holds the waiter weakly, so a supervisor that calls back late (or never)
  // keeps no gateway object alive; the waiter lives through its own pending timer.
  std::weak_ptr<Waiter> weak = w;
  slots.ensure_running(entry->name, [self, weak, g = guard](Lease lease, std::string error) {
    std::lock_guard lk(g->mu);
    if (!g->alive) return;
    if (auto waiter = weak.lock()) self->on_switch_done(std::move(waiter), std::move(lease), std::move(error));
  });
}

void Gateway::Impl::on_switch_done(std::shared_ptr<Waiter> w, Lease lease, std::string error) {
  auto strand = w->strand;
  asio::dispatch(strand, [this, w = std::move(w), lease = std::move(lease), error = std::move(error)]() mutable {
    if (w->done) return;
    // The lease was taken when the slot became ready (SlotControl::ensure_running).
    if (!lease) return waiter_fail(w, 503, "switching to model '" + w->job.model->name + "' failed: " + error, "switch_failed");
    auto snap = slots.snapshot();
    release_waiter(w);
    ProxyJob next = std::move(w->job);
    next.lease = std::move(lease);
    next.engine_host = snap.host;
    next.engine_port = snap.port;
    next.client_stream_started = w->stream && w->heartbeat_started;
    start_proxy(shared, std::move(next));
  });
}

void Gateway::Impl::release_waiter(const std::shared_ptr<Waiter>& w) {
  w->done = true;
  w->timeout.cancel();
  w->heartbeat.cancel();
  {
    std::lock_guard lk(queue_mu);
    --queued[w->job.model->name];
  }
  metrics.add_queued(-1);
}

void Gateway::Impl::waiter_heartbeat(const std::shared_ptr<Waiter>& w) {
  if (opt.heartbeat_ms <= 0) return;
  w->heartbeat.expires_after(std::chrono::milliseconds(opt.heartbeat_ms));
  w->heartbeat.async_wait([this, w](boost::system::error_code ec) {
    if (ec || w->done) return;
    if (!w->heartbeat_started) {
      w->heartbeat_started = true;
      w->job.res->start_stream(200);
    }
    w->job.res->write(sse::format_comment("waiting for model " + w->job.model->name + " to load"));
    waiter_heartbeat(w);
  });
}

void Gateway::Impl::waiter_fail(const std::shared_ptr<Waiter>& w, int status, const std::string& message,
                                const std::string& code) {
  release_waiter(w);
  auto& res = *w->job.res;
  if (w->heartbeat_started) {
    // The client already has a 200 stream: an error event and no [DONE].
    res.write(sse::format_data(dump_safe(make_error(message, "overloaded_error", code))));
    res.end();
    record_local_answer(shared, w->job.route, w->job.model->name, w->job.requested_id, w->stream, 200, code, w->job.start);
    return;
  }
  http::send_error(res, status, message, "overloaded_error", code, false,
                   {{"Retry-After", std::to_string(opt.retry_after_s)}});
  record_local_answer(shared, w->job.route, w->job.model->name, w->job.requested_id, w->stream, status, code, w->job.start);
}

}  // namespace servedeck::gateway
