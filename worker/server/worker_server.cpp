#include "worker/server/worker_server.hpp"

#include <cstdio>
#include <exception>
#include <utility>

#include "common/openai_error.hpp"
#include "worker/server/openai_format.hpp"

namespace servedeck::worker {

std::string_view to_string(LoadState s) {
  switch (s) {
    case LoadState::loading: return "loading";
    case LoadState::ready: return "ready";
    case LoadState::failed: return "failed";
  }
  return "unknown";
}

void reply_error(const RouteContext& ctx, const std::string& route, http::Responder& res, int status,
                 std::string_view message, std::string_view type, std::string_view code, std::string_view param) {
  ctx.metrics.count_request(route, status);
  if (param.empty()) return http::send_error(res, status, message, type, code, /*from_engine=*/true);
  auto body = make_error(message, type, code, ErrorSource::engine);
  body["error"]["param"] = param;
  res.send(status, "application/json", body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
}

WorkerServer::WorkerServer(WorkerServerOptions options, ModelLoader loader)
    : options_(std::move(options)), loader_(std::move(loader)) {}

WorkerServer::~WorkerServer() { stop(); }

void WorkerServer::start() {
  http::ServerOptions so;
  so.host = options_.host;
  so.port = options_.port;
  so.threads = options_.http_threads;
  http_ = std::make_unique<http::Server>(so, [this](http::Request req, std::shared_ptr<http::Responder> res) {
    handle(std::move(req), std::move(res));
  });
  http_->start();
  load_thread_ = std::thread([this] { load(); });
}

int WorkerServer::port() const { return http_ ? http_->port() : 0; }

void WorkerServer::stop() {
  if (stopped_.exchange(true)) return;
  if (http_) http_->stop();
  if (load_thread_.joinable()) load_thread_.join();
  std::lock_guard lock(mutex_);
  model_.reset();
}

LoadState WorkerServer::state() const {
  std::lock_guard lock(mutex_);
  return state_;
}

std::string WorkerServer::load_error() const {
  std::lock_guard lock(mutex_);
  return error_;
}

double WorkerServer::load_progress() const { return progress_.load(); }

LoadState WorkerServer::wait_loaded(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mutex_);
  cv_.wait_for(lock, timeout, [this] { return state_ != LoadState::loading; });
  return state_;
}

LoadedModel* WorkerServer::model() {
  std::lock_guard lock(mutex_);
  return state_ == LoadState::ready ? model_.get() : nullptr;
}

void WorkerServer::load() {
  std::unique_ptr<LoadedModel> m;
  std::string error;
  try {
    m = loader_([this](double p) { progress_.store(std::min(1.0, std::max(0.0, p))); });
    if (!m || !m->text || !m->engine) error = "the model loader returned an incomplete model";
  } catch (const std::exception& e) {
    error = e.what();
  }
  {
    std::lock_guard lock(mutex_);
    if (error.empty()) {
      model_ = std::move(m);
      state_ = LoadState::ready;
      progress_.store(1.0);
    } else {
      state_ = LoadState::failed;
      error_ = error;
    }
  }
  cv_.notify_all();
}

void WorkerServer::handle(http::Request req, std::shared_ptr<http::Responder> res) {
  // Cheap routes answer on the I/O thread; the rest go to the blocking pool (tokenizing and
  // template rendering are CPU work).
  // HEAD is answered as GET on the read-only routes (the server sends the head only).
  if ((req.method == "GET" || req.method == "HEAD") &&
      (req.path == "/health" || req.path == "/metrics" || req.path == "/v1/models")) {
    route(req, res);
    return;
  }
  auto shared_req = std::make_shared<http::Request>(std::move(req));
  if (!http_->post_blocking([this, shared_req, res] { route(*shared_req, res); })) {
    metrics_.count_request("overloaded", 503);
    http::send_error(*res, 503, "the worker's request queue is full; retry later", "overloaded_error", "queue_full", true);
  }
}

void WorkerServer::route(const http::Request& req, const std::shared_ptr<http::Responder>& res) {
  const std::string& path = req.path;
  if ((path == "/health" || path == "/metrics" || path == "/v1/models") && req.method != "GET" && req.method != "HEAD") {
    metrics_.count_request(path == "/v1/models" ? "models" : "unknown", 405);
    http::send_error(*res, 405, req.method + " " + path + ": expected GET", "invalid_request_error", "method_not_allowed", true,
                     {{"Allow", "GET, HEAD"}});
    return;
  }
  if (path == "/health") {
    const LoadState s = state();
    if (s == LoadState::ready) {
      res->send(200, "application/json", R"({"status":"ok"})");
    } else if (s == LoadState::loading) {
      res->send(503, "application/json", dump_json({{"status", "loading"}, {"progress", load_progress()}}));
    } else {
      res->send(503, "application/json", dump_json({{"status", "failed"}, {"error", load_error()}}));
    }
    return;
  }
  if (path == "/metrics") {
    LoadedModel* m = model();
    std::optional<EngineStats> stats;
    if (m) stats = m->engine->stats();
    res->send(200, "text/plain; version=0.0.4", metrics_.render(stats ? &*stats : nullptr, m != nullptr, load_progress()));
    return;
  }
  if (path == "/v1/models") {
    LoadedModel* m = model();
    nlohmann::json entry = {{"id", options_.served_model_name}, {"object", "model"}, {"created", unix_now()},
                            {"owned_by", "servedeck"}, {"root", m ? m->root : ""}, {"parent", nullptr},
                            {"max_model_len", m ? nlohmann::json(m->max_model_len) : nlohmann::json(nullptr)}};
    metrics_.count_request("models", 200);
    res->send(200, "application/json", dump_json({{"object", "list"}, {"data", nlohmann::json::array({entry})}}));
    return;
  }
  using RouteFn = void (*)(const RouteContext&, const http::Request&, std::shared_ptr<http::Responder>);
  RouteFn fn = nullptr;
  std::string name;
  if (path == "/v1/chat/completions") fn = handle_chat, name = "chat";
  else if (path == "/v1/completions") fn = handle_completions, name = "completions";
  else if (path == "/tokenize") fn = handle_tokenize, name = "tokenize";
  else if (path == "/detokenize") fn = handle_detokenize, name = "detokenize";
  if (!fn) {
    metrics_.count_request("unknown", 404);
    http::send_error(*res, 404, "no route " + req.method + " " + path, "not_found_error", "unknown_route", true);
    return;
  }
  if (req.method != "POST") {
    metrics_.count_request(name, 405);
    http::send_error(*res, 405, req.method + " " + path + ": expected POST", "invalid_request_error", "method_not_allowed", true,
                     {{"Allow", "POST"}});
    return;
  }
  LoadedModel* m = model();
  if (!m) {
    const LoadState s = state();
    metrics_.count_request(name, 503);
    const std::string msg = s == LoadState::failed
                                ? "the model failed to load: " + load_error()
                                : "the model is still loading (progress " + std::to_string(load_progress()) + ")";
    http::send_error(*res, 503, msg, "server_error", s == LoadState::failed ? "model_failed" : "model_loading", true);
    return;
  }
  // note: the request's "model" is not checked against the served name (vLLM answers 404);
  // the daemon routes by model already and may send an alias (effort presets).
  RouteContext ctx{options_, *m, metrics_};
  fn(ctx, req, res);
}

}  // namespace servedeck::worker
