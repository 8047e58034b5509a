// Verbs that talk to a running daemon: switch, stop, status, models, logs. `status`, `models`
// and `logs` fall back to local files when the daemon is down.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "common/http/client.hpp"
#include "common/json_limits.hpp"
#include "gateway/cli/cli_common.hpp"
#include "gateway/state/store.hpp"
#include "gateway/supervisor/launch_log.hpp"
#include "gateway/supervisor/proc_scan.hpp"
#include "registry/registry.hpp"

namespace servedeck::cli {

namespace {

std::string fmt_gib(const nlohmann::json& v) {
  if (!v.is_number()) return "-";
  char b[32];
  std::snprintf(b, sizeof b, "%.1f GiB", v.get<double>());
  return b;
}

std::string fmt_duration(double s) {
  long t = static_cast<long>(s);
  char b[48];
  if (t >= 3600) std::snprintf(b, sizeof b, "%ldh%02ldm", t / 3600, (t % 3600) / 60);
  else if (t >= 60) std::snprintf(b, sizeof b, "%ldm%02lds", t / 60, t % 60);
  else std::snprintf(b, sizeof b, "%lds", t);
  return b;
}

std::string fmt_time(int64_t ms) {
  if (ms <= 0) return "-";
  std::time_t t = static_cast<std::time_t>(ms / 1000);
  std::tm tm{};
  localtime_r(&t, &tm);
  char b[32];
  std::strftime(b, sizeof b, "%Y-%m-%d %H:%M:%S", &tm);
  return b;
}

/// The daemon, or nullopt after printing why to stderr (for verbs that need it). When the state
/// directory is only a guess (no config found), says so instead of calling the daemon not running.
std::optional<DaemonAddress> need_daemon(const Args& a) {
  std::string why;
  bool denied = false;
  auto sd = resolve_state_dir(a);
  auto d = find_daemon(sd.dir, why, &denied);
  if (d) return d;
  if (denied)
    std::cerr << "servedeck: cannot tell whether the daemon runs: " << why << "; " << access_hint() << "\n";
  else if (!sd.guessed_because.empty())
    std::cerr << "servedeck: cannot tell where the daemon is: " << sd.guessed_because << "\n";
  else
    std::cerr << "servedeck: the daemon is not running (" << why << "); start it with `servedeck serve`\n";
  return d;
}

/// For `status`/`logs` when no daemon answered in a guessed state directory: the CLI does not
/// know which daemon to ask, so it says that (exit 2) rather than reporting one down.
int cannot_locate(const std::string& verb, const StateDir& sd) {
  std::cerr << "servedeck: " << verb << ": cannot tell where the daemon is: " << sd.guessed_because << "\n";
  return 2;
}

int run_stream(const Args& a, const std::string& target, const nlohmann::json& body, const std::string& what) {
  auto d = need_daemon(a);
  if (!d) return 2;
  nlohmann::json r;
  try {
    r = admin_stream(*d, target, body, [](const std::string& line) {
      std::cout << line << std::endl;
    });
  } catch (const std::exception& e) {
    std::cerr << "servedeck: " << what << ": cannot reach the daemon at " << d->host << ":" << d->port << ": "
              << e.what() << "\n";
    return 2;
  }
  if (r.value("ok", false)) return 0;
  std::cerr << "servedeck: " << what << " failed: " << r.value("error", std::string("(no reason)")) << "\n";
  return 1;
}

nlohmann::json launch_json(const state::LaunchRecord& l) {
  bool alive = false;
  if (l.pid > 0)
    if (auto st = supervisor::read_proc_stat(l.pid))
      alive = st->start_time == static_cast<uint64_t>(l.pid_start_time) && st->state != 'Z';
  return {{"id", l.id},           {"model", l.model},       {"state", l.state},     {"pid", l.pid},
          {"pid_alive", alive},   {"port", l.port},         {"start_ms", l.start_ms}, {"ready_ms", l.ready_ms},
          {"stop_ms", l.stop_ms}, {"exit_status", l.exit_status ? nlohmann::json(*l.exit_status) : nlohmann::json()},
          {"why", l.why},         {"log_path", l.log_path}};
}

/// `status` with the daemon down: what the state store last recorded.
int status_offline(const Args& a, const std::string& dir, const std::string& why) {
  nlohmann::json j = {{"daemon", {{"up", false}, {"why", why}}}, {"state_dir", dir}};
  std::optional<state::LaunchRecord> last;
  std::vector<nlohmann::json> events;
  std::string store_error;
  if (!std::filesystem::exists(std::filesystem::path(dir) / "state.db")) {
    store_error = "no state store at " + dir + "/state.db";
  } else {
    try {
      state::Store store(dir);
      last = store.latest_launch();
      events = store.recent_events(5);
    } catch (const std::exception& e) {
      store_error = e.what();
    }
  }
  j["last_launch"] = last ? launch_json(*last) : nlohmann::json();
  j["recent_events"] = events;
  if (!store_error.empty()) j["store_error"] = store_error;
  if (a.has("--json")) {
    std::cout << dump_safe(j, 2) << "\n";
    return 3;
  }
  std::cout << "servedeck daemon: DOWN (" << why << ")\n";
  if (!store_error.empty()) {
    std::cout << "state store: " << store_error << "\n";
    return 3;
  }
  std::cout << "from the state store " << dir << "/state.db:\n";
  if (!last) {
    std::cout << "  no launch recorded\n";
    return 3;
  }
  auto l = j["last_launch"];
  std::cout << "  last launch #" << last->id << ": " << last->model << ", state " << last->state << ", pid "
            << last->pid << (l["pid_alive"].get<bool>() ? " (still running)" : " (gone)") << "\n"
            << "  started " << fmt_time(last->start_ms) << ", ready " << fmt_time(last->ready_ms) << ", stopped "
            << fmt_time(last->stop_ms) << "\n";
  if (!last->why.empty()) std::cout << "  why: " << last->why << "\n";
  if (!last->log_path.empty()) std::cout << "  log: " << last->log_path << "\n";
  return 3;
}

}  // namespace

int cmd_switch(const Args& a) {
  if (a.positional.size() != 1) {
    std::cerr << "usage: servedeck switch MODEL\n";
    return 2;
  }
  return run_stream(a, "/admin/switch", {{"model", a.positional[0]}}, "switch to " + a.positional[0]);
}

int cmd_stop(const Args& a) { return run_stream(a, "/admin/stop", nlohmann::json::object(), "stop"); }

int cmd_status(const Args& a) {
  const StateDir sd = resolve_state_dir(a);
  const std::string& dir = sd.dir;
  std::string why;
  bool denied = false;
  auto d = find_daemon(dir, why, &denied);
  if (denied) {
    std::cerr << "servedeck: status: cannot tell whether the daemon runs: " << why << "; " << access_hint() << "\n";
    return 2;
  }
  if (!d) return sd.guessed_because.empty() ? status_offline(a, dir, why) : cannot_locate("status", sd);
  nlohmann::json s;
  int status = 0;
  try {
    s = admin_json(*d, "GET", "/admin/status", nullptr, status);
  } catch (const std::exception& e) {
    if (!sd.guessed_because.empty()) return cannot_locate("status", sd);
    return status_offline(a, dir, "no answer at " + d->host + ":" + std::to_string(d->port) + ": " + e.what());
  }
  if (status != 200) {
    std::cerr << "servedeck: status: daemon answered HTTP " << status << ": " << dump_safe(s) << admin_refusal_hint(*d, status)
              << "\n";
    return status == 401 ? 2 : 1;
  }
  if (a.has("--json")) {
    std::cout << dump_safe(s, 2) << "\n";
    return 0;
  }
  std::cout << "servedeck daemon: up (pid " << s["daemon"].value("pid", 0) << ", " << d->host << ":" << d->port
            << ")\n";
  std::cout << "slot " << s.value("slot", "main") << ": " << s.value("state", "?");
  if (!s.value("model", std::string()).empty())
    std::cout << "  model " << s.value("model", "") << " (" << s.value("served_name", "") << ")";
  std::cout << "\n";
  auto integer = [&](const char* key) {
    return s.contains(key) && s[key].is_number_integer() ? s[key].get<int64_t>() : int64_t{0};
  };
  if (integer("pid") != 0) {  // a live engine (the daemon reports pid 0 for a failed/stopped slot)
    double uptime = s.contains("uptime_s") && s["uptime_s"].is_number() ? s["uptime_s"].get<double>() : 0.0;
    std::cout << "  pid " << integer("pid") << "  port " << integer("port") << "  uptime " << fmt_duration(uptime)
              << "  ctx " << integer("ctx") << "\n"
              << "  VRAM " << fmt_gib(s["vram_gib"]) << "  host RAM " << fmt_gib(s["host_rss_gib"]) << "  in flight "
              << integer("in_flight") << "\n";
  } else if (integer("last_pid") != 0) {  // the last launch's figures, labelled as such; no live readings
    std::cout << "  last launch: pid " << integer("last_pid") << "  port " << integer("last_port");
    const std::string reason =
        s.contains("exit_reason") && s["exit_reason"].is_string() ? s["exit_reason"].get<std::string>() : "";
    if (reason.rfind("killed by", 0) == 0)
      std::cout << "  " << reason;  // "killed by signal 9 (SIGKILL)", not "exit status 137"
    else if (s.contains("exit_status") && s["exit_status"].is_number_integer())
      std::cout << "  exit status " << s["exit_status"].get<int>();
    std::cout << "\n";
  }
  if (!s.value("switching_to", std::string()).empty()) std::cout << "  switching to " << s["switching_to"] << "\n";
  if (!s.value("log_path", std::string()).empty()) std::cout << "  log " << s.value("log_path", "") << "\n";
  if (!s.value("blocker", std::string()).empty()) std::cout << "  BLOCKED: " << s.value("blocker", "") << "\n";
  if (!s.value("last_error", std::string()).empty()) std::cout << "  last error: " << s.value("last_error", "") << "\n";
  if (s.contains("refused_model") && s["refused_model"].is_string()) {
    // "last switch refused: MODEL: check: message; check: message" (the refused checks, one a line in the JSON).
    std::string checks;
    if (s.contains("refusal") && s["refusal"].is_string()) {
      std::istringstream lines(s["refusal"].get<std::string>());
      for (std::string line; std::getline(lines, line);)
        if (!line.empty()) checks += (checks.empty() ? "" : "; ") + line;
    }
    std::cout << "  last switch refused: " << s["refused_model"].get<std::string>() << ": " << checks << "\n";
  }
  return 0;
}

std::string models_table(const nlohmann::json& models) {
  struct Row {
    std::string name, engine, ctx, state, ids;
  };
  std::vector<Row> rows;
  std::size_t w_name = 0, w_engine = 0, w_ctx = 0, w_state = 0;
  auto text = [](const nlohmann::json& m, const char* key) {
    return m.is_object() && m.contains(key) && m[key].is_string() ? m[key].get<std::string>() : std::string();
  };
  for (const auto& m : models) {
    Row r{text(m, "name"), text(m, "engine"), "", text(m, "state"), ""};
    r.ctx = m.is_object() && m.contains("ctx") && m["ctx"].is_number_integer()
                ? std::to_string(m["ctx"].get<int64_t>()) : "-";
    if (m.is_object() && m.contains("ids") && m["ids"].is_array())
      for (const auto& id : m["ids"])
        if (id.is_string()) r.ids += (r.ids.empty() ? "" : ", ") + id.get<std::string>();
    w_name = std::max(w_name, r.name.size());
    w_engine = std::max(w_engine, r.engine.size());
    w_ctx = std::max(w_ctx, r.ctx.size());
    w_state = std::max(w_state, r.state.size());
    rows.push_back(std::move(r));
  }
  auto pad = [](const std::string& s, std::size_t w) { return s + std::string(w > s.size() ? w - s.size() : 0, ' '); };
  std::string out;
  for (const auto& r : rows) {
    std::string line = pad(r.name, w_name) + "  " + pad(r.engine, w_engine) + "  ctx " + pad(r.ctx, w_ctx) + "  " +
                       pad(r.state, w_state) + "  " + r.ids;
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line + "\n";
  }
  return out;
}

int cmd_models(const Args& a) {
  std::string why;
  nlohmann::json models;
  if (auto d = find_daemon(state_dir(a), why)) {
    try {
      int status = 0;
      auto j = admin_json(*d, "GET", "/admin/models", nullptr, status);
      if (status == 200) models = j["models"];
    } catch (const std::exception&) {
    }
  }
  if (models.is_null()) {
    auto config = found_config(a);
    if (!config) {
      std::cerr << "servedeck: models: " << no_config_message() << "\n";
      return 2;
    }
    try {
      auto reg = registry::load_registry(*config);
      models = nlohmann::json::array();
      for (const auto& m : reg.models)
        models.push_back({{"name", m.name}, {"served_name", m.served_name}, {"ids", m.all_ids()},
                          {"engine", std::string(registry::to_string(m.engine))}, {"ctx", m.ctx},
                          {"description", m.description}, {"state", "unknown (daemon down)"}});
    } catch (const registry::RegistryError& e) {
      for (const auto& diag : e.diagnostics) std::cerr << diag.to_string() << "\n";
      return 1;
    } catch (const std::exception& e) {
      std::cerr << "servedeck: models: " << e.what() << "\n";
      return 1;
    }
  }
  if (a.has("--json")) {
    std::cout << dump_safe(models, 2) << "\n";
    return 0;
  }
  std::cout << models_table(models);
  return 0;
}

int cmd_logs(const Args& a) {
  const StateDir sd = resolve_state_dir(a);
  const std::string& dir = sd.dir;
  std::string model = a.has("--model") ? a.get("--model") : (a.positional.empty() ? "" : a.positional[0]);
  std::string lines = a.get("--lines", "100");
  std::string why;
  if (auto d = find_daemon(dir, why)) {
    http::ClientRequest r;
    r.host = d->host;
    r.port = d->port;
    r.target = "/admin/logs?lines=" + lines + (model.empty() ? "" : "&model=" + model) +
               (a.has("--follow") ? "&follow=1" : "");
    r.timeout_ms = a.has("--follow") ? 24 * 3600 * 1000 : 30000;
    if (!d->admin_token.empty()) r.headers.push_back({"Authorization", "Bearer " + d->admin_token});
    int status = 0;
    std::string err;
    try {
      http::fetch_stream(r, [&](int st, const std::map<std::string, std::string>&) { status = st; },
                         [&](std::string_view chunk) {
                           if (status != 200) err += chunk;
                           else std::cout.write(chunk.data(), static_cast<std::streamsize>(chunk.size())).flush();
                           return true;
                         });
      if (status == 200) return 0;
      std::cerr << "servedeck: logs: HTTP " << status << ": " << err << admin_refusal_hint(*d, status) << "\n";
      return 1;
    } catch (const std::exception& e) {
      why = e.what();
    }
  }
  // Daemon down: read the newest launch log recorded in the store (when the CLI knows which).
  if (!sd.guessed_because.empty()) return cannot_locate("logs", sd);
  try {
    state::Store store(dir);
    for (const auto& l : store.recent_launches(200)) {
      if (!model.empty() && l.model != model) continue;
      if (l.log_path.empty()) continue;
      std::cerr << "servedeck: daemon down (" << why << "); " << l.log_path << ":\n";
      std::cout << supervisor::tail_lines(l.log_path, std::atoi(lines.c_str())) << "\n";
      return 0;
    }
  } catch (const std::exception& e) {
    std::cerr << "servedeck: logs: " << e.what() << "\n";
    return 1;
  }
  std::cerr << "servedeck: no launch log" << (model.empty() ? "" : " for " + model) << "\n";
  return 1;
}

}  // namespace servedeck::cli
