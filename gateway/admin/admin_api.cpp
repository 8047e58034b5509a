#include "gateway/admin/admin_api.hpp"

#include <atomic>
#include <cstdio>
#include <memory>
#include <thread>

#include "common/json_limits.hpp"
#include "common/sse.hpp"
#include "gateway/admin/log_follower.hpp"
#include "gateway/supervisor/launch_log.hpp"

namespace servedeck::admin {

namespace {

using Res = std::shared_ptr<http::Responder>;

void admin_error(http::Responder& res, int status, const std::string& message, const std::string& code) {
  http::send_error(res, status, message, "servedeck_admin_error", code);
}

/// Parses {"model": "..."}; sends the error and returns "" when absent.
std::string model_from_body(const http::Request& req, http::Responder& res) {
  auto j = parse_untrusted(req.body);
  if (j.is_discarded() || !j.is_object() || !j.contains("model") || !j["model"].is_string() ||
      j["model"].get<std::string>().empty()) {
    admin_error(res, 400, "expected a JSON body {\"model\": \"<registry name or served name>\"}, got: " +
                              req.body.substr(0, 200), "invalid_body");
    return "";
  }
  return j["model"].get<std::string>();
}

/// Streams a queued supervisor operation: its progress lines as SSE events as they happen, then
/// the result event. `submit` queues it on the supervisor's switch queue (never the blocking pool,
/// which status and preflight calls share) and returns at once.
void stream_operation(AdminContext& ctx, const Res& res,
                      const std::function<void(supervisor::Progress, supervisor::Supervisor::Done)>& submit) {
  res->start_stream(200, "text/event-stream");
  // note: the operation continues when the client goes away (a half-done switch is worse than
  // an unwatched one); writes to a gone client are simply dropped.
  supervisor::Progress progress = [res, hook = ctx.on_progress](const std::string& line) {
    if (hook) hook(line);
    res->write(sse::format_data(line));
  };
  submit(progress, [res](const supervisor::OpResult& r) {
    nlohmann::json result = {{"ok", r.ok}, {"error", r.error}, {"seconds", r.seconds}};
    res->write("event: result\ndata: " + dump_safe(result) + "\n\n");
    res->end();
  });
}

std::atomic<int> g_followers{0};

int hex(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

std::string query_param(const std::string& query, const std::string& key) {
  std::size_t pos = 0;
  while (pos <= query.size()) {
    std::size_t amp = query.find('&', pos);
    std::string part = query.substr(pos, amp == std::string::npos ? std::string::npos : amp - pos);
    std::size_t eq = part.find('=');
    if (part.substr(0, eq) == key) {
      std::string raw = eq == std::string::npos ? "" : part.substr(eq + 1);
      std::string out;
      for (std::size_t i = 0; i < raw.size(); ++i) {
        if (raw[i] == '+') out += ' ';
        else if (raw[i] == '%' && i + 2 < raw.size() && hex(raw[i + 1]) >= 0 && hex(raw[i + 2]) >= 0) {
          out += static_cast<char>(hex(raw[i + 1]) * 16 + hex(raw[i + 2]));
          i += 2;
        } else out += raw[i];
      }
      return out;
    }
    if (amp == std::string::npos) break;
    pos = amp + 1;
  }
  return "";
}

std::vector<Route> admin_routes(AdminContext ctx) {
  auto c = std::make_shared<AdminContext>(std::move(ctx));
  std::vector<Route> routes;

  routes.push_back({"POST", "/admin/switch", [c](http::Request req, Res res) {
                      std::string model = model_from_body(req, *res);
                      if (model.empty()) return;
                      stream_operation(*c, res, [c, model](supervisor::Progress p, supervisor::Supervisor::Done d) {
                        c->supervisor->submit_switch(model, std::move(p), std::move(d));
                      });
                    }});

  routes.push_back({"POST", "/admin/stop", [c](http::Request, Res res) {
                      stream_operation(*c, res, [c](supervisor::Progress p, supervisor::Supervisor::Done d) {
                        c->supervisor->submit_stop("stopped by the admin API", std::move(p), std::move(d));
                      });
                    }});

  routes.push_back({"GET", "/admin/status", [c](http::Request, Res res) {
                      bool posted = c->post_blocking([c, res] {
                        nlohmann::json j;
                        try {
                          j = c->supervisor->status_json();
                        } catch (const std::exception& e) {
                          admin_error(*res, 500, std::string("status: ") + e.what(), "status_failed");
                          return;
                        }
                        j["daemon"] = c->daemon_info ? c->daemon_info() : nlohmann::json::object();
                        j["daemon"]["up"] = true;
                        res->send(200, "application/json", dump_safe(j));
                      });
                      if (!posted) admin_error(*res, 503, "the daemon's blocking pool is full; retry", "busy");
                    }});

  routes.push_back({"GET", "/admin/logs", [c](http::Request req, Res res) {
                      std::string model = query_param(req.query, "model");
                      int lines = 100;
                      try {
                        std::string l = query_param(req.query, "lines");
                        if (!l.empty()) lines = std::stoi(l);
                      } catch (const std::exception&) {
                        admin_error(*res, 400, "lines must be an integer, got '" + query_param(req.query, "lines") + "'",
                                    "invalid_query");
                        return;
                      }
                      if (lines <= 0 || lines > 100000) lines = 100;
                      std::string path = c->supervisor->log_path(model);
                      if (path.empty()) {
                        admin_error(*res, 404,
                                    model.empty() ? "no launch log yet" : "no launch log for model '" + model + "'",
                                    "no_log");
                        return;
                      }
                      bool follow = query_param(req.query, "follow") == "1" || query_param(req.query, "follow") == "true";
                      if (!follow) {
                        std::string t = supervisor::tail_lines(path, lines);
                        res->send(200, "text/plain; charset=utf-8", t.empty() ? t : t + "\n",
                                  {{"X-Servedeck-Log-Path", path}});
                        return;
                      }
                      if (g_followers.fetch_add(1) >= k_max_log_followers) {
                        g_followers.fetch_sub(1);
                        admin_error(*res, 503, "too many log followers (" + std::to_string(k_max_log_followers) + ")",
                                    "busy");
                        return;
                      }
                      try {
                        std::thread([path, lines, res] {
                          const std::string error = follow_log(path, lines, res);
                          if (!error.empty()) std::fprintf(stderr, "servedeck: admin: %s\n", error.c_str());
                          g_followers.fetch_sub(1);
                        }).detach();
                      } catch (const std::exception& e) {  // no thread to be had
                        g_followers.fetch_sub(1);
                        admin_error(*res, 503, std::string("cannot follow the log now: ") + e.what(), "busy");
                      }
                    }});

  routes.push_back({"POST", "/admin/preflight", [c](http::Request req, Res res) {
                      std::string model = model_from_body(req, *res);
                      if (model.empty()) return;
                      const registry::ModelEntry* m = c->registry->find_by_name(model);
                      if (!m) m = c->registry->find_by_id(model);
                      if (!m) {
                        admin_error(*res, 404, "unknown model '" + model + "'", "unknown_model");
                        return;
                      }
                      bool posted = c->post_blocking([c, m, res] {
                        try {
                          auto report = preflight::run_preflight(*c->registry, *m, *c->readings, m->port);
                          res->send(200, "application/json",
                                    dump_safe(nlohmann::json{{"report", report.to_json()}, {"table", report.table()},
                                                             {"refused", report.refused()}}));
                        } catch (const std::exception& e) {
                          admin_error(*res, 500, std::string("preflight: ") + e.what(), "preflight_failed");
                        }
                      });
                      if (!posted) admin_error(*res, 503, "the daemon's blocking pool is full; retry", "busy");
                    }});

  routes.push_back({"GET", "/admin/models", [c](http::Request, Res res) {
                      auto snap = c->supervisor->snapshot();
                      nlohmann::json list = nlohmann::json::array();
                      for (const auto& m : c->registry->models) {
                        list.push_back({{"name", m.name},
                                        {"served_name", m.served_name},
                                        {"ids", m.all_ids()},
                                        {"engine", std::string(registry::to_string(m.engine))},
                                        {"ctx", m.ctx},
                                        {"description", m.description},
                                        {"state", snap.model == m.name ? std::string(gateway::to_string(snap.state))
                                                                       : std::string("stopped")}});
                      }
                      res->send(200, "application/json", dump_safe(nlohmann::json{{"models", list}}));
                    }});
  return routes;
}

}  // namespace servedeck::admin
