// `servedeck serve`: the daemon. Loads the registry, opens the state store, serves the gateway
// and the admin API, then (listening already: completions get 503 `slot_recovering` meanwhile)
// adopts or reaps the engine a previous daemon left, starts the default model, and on
// SIGTERM/SIGINT stops serving, then stops the engine cleanly. SIGHUP (the terminal that started
// it closing) is logged and ignored: the daemon and its engine keep serving.
//
// note: on SIGTERM the engine is stopped, not left for adoption. A daemon stop is how an operator
// (and systemd, KillMode=mixed) says "give the GPU back"; leaving a 100 GiB engine without a
// supervisor until some later daemon maybe adopts it would hide it from every check. Adoption
// exists for the other case: the daemon died without a chance to stop anything.
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <mutex>
#include <thread>

#include "gateway/admin/admin_api.hpp"
#include "gateway/admin/admin_token.hpp"
#include "common/json_limits.hpp"
#include "gateway/cli/cli_common.hpp"
#include "gateway/cli/serve_state.hpp"
#include "gateway/server/descriptor_limit.hpp"
#include "gateway/server/gateway.hpp"
#include "gateway/service/notify.hpp"
#include "gateway/state/store.hpp"
#include "gateway/supervisor/supervisor.hpp"
#include "policies/capture.hpp"
#include "policies/restore_reasoning.hpp"
#include "preflight/preflight.hpp"
#include "registry/registry.hpp"

namespace servedeck::cli {

namespace {

std::mutex g_log_mu;

void log_line(const std::string& line) {
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  localtime_r(&t, &tm);
  char b[32];
  std::strftime(b, sizeof b, "%H:%M:%S", &tm);
  std::lock_guard lk(g_log_mu);
  std::cerr << b << " servedeck: " << line << std::endl;
}

void write_daemon_file(const std::string& dir, const std::string& host, int port, const std::string& config) {
  std::string path = daemon_file(dir);
  std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp);
    ::chmod(tmp.c_str(), 0640);  // the CLI's group reads it (the state directory decides who reaches it)
    f << dump_safe(nlohmann::json{{"host", host}, {"port", port}, {"pid", static_cast<int64_t>(getpid())},
                                  {"config", config}, {"started_ms", state::now_ms()}})
      << "\n";
  }
  std::filesystem::rename(tmp, path);
}

}  // namespace

int cmd_serve(const Args& a) {
  // Signals are taken synchronously by sigwait below; block them before any thread exists so
  // every thread inherits the mask.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  signal(SIGPIPE, SIG_IGN);
  // Nothing the daemon (or an engine it starts) creates is readable by other users; the files
  // the CLI needs get their group bit explicitly (docs/operations.md "Security").
  ::umask(027);

  auto found = found_config(a);
  if (!found) {
    std::cerr << "servedeck: serve: " << no_config_message() << "\n";
    return 2;
  }
  const std::string config = *found;
  registry::Registry reg;
  try {
    reg = registry::load_registry(config);
  } catch (const registry::RegistryError& e) {
    for (const auto& d : e.diagnostics) std::cerr << d.to_string() << "\n";
    std::cerr << "servedeck: serve: " << config << " has errors; not starting\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "servedeck: serve: " << e.what() << "\n";
    return 2;
  }
  reg.server.state_dir = state_dir_for(a, reg);  // the CLI's rule: --state-dir, $SERVEDECK_STATE_DIR, config
  if (a.has("--port")) {
    try {
      std::size_t used = 0;
      const std::string v = a.get("--port");
      reg.server.listen_port = std::stoi(v, &used);
      if (used != v.size()) throw std::invalid_argument(v);
    } catch (const std::exception&) {
      std::cerr << "servedeck: --port expects an integer 0..65535, got '" << a.get("--port") << "'\n";
      return 2;
    }
    if (reg.server.listen_port < 0 || reg.server.listen_port > 65535) {
      std::cerr << "servedeck: --port " << reg.server.listen_port << " is out of range 0..65535\n";
      return 2;
    }
  }
  const std::string dir = reg.server.state_dir;
  try {
    if (std::string refused = prepare_state_dir(dir, config, log_line); !refused.empty()) {
      std::cerr << "servedeck: serve: " << refused << "\n";
      return 2;
    }
    state::Store store(dir);
    // One daemon per state directory: a second one would adopt (and later stop) the first one's
    // engine. The lock is held for the life of the process and released by the kernel on exit.
    const std::string lock_path = (std::filesystem::path(dir) / "daemon.lock").string();
    const int lock_fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (lock_fd < 0 || ::flock(lock_fd, LOCK_EX | LOCK_NB) != 0) {
      std::string why, who;
      if (auto d = find_daemon(dir, why)) who = "pid " + std::to_string(d->pid) + " on " + d->host + ":" + std::to_string(d->port);
      std::cerr << "servedeck: serve: another daemon already runs with state directory " << dir
                << (who.empty() ? "" : " (" + who + ")") << "; stop it first or use another --state-dir\n";
      if (lock_fd >= 0) ::close(lock_fd);
      return 1;
    }
    const std::string admin_token = issue_admin_token(dir);
    // Capture (off unless a model's policy and SERVEDECK_CAPTURE=1 both say so) writes under the
    // state directory unless SERVEDECK_CAPTURE_DIR names another place.
    {
      policies::CaptureOptions co;
      const char* cdir = std::getenv("SERVEDECK_CAPTURE_DIR");
      co.dir = cdir && *cdir ? cdir : (std::filesystem::path(dir) / "capture").string();
      policies::configure_capture(co);
    }
    auto janitor = start_janitor(store, reg.server, log_line);  // retention: now, then periodically
    auto readings = preflight::system_readings();
    int gpu = 0;
    if (const auto* dm = reg.find_by_name(reg.server.default_model)) gpu = dm->gpu;
    std::unique_ptr<supervisor::GpuMemoryProbe> probe;
    if (readings->gpu_total_gib(gpu)) probe = std::make_unique<supervisor::ReadingsGpuProbe>(*readings, gpu);
    else log_line("no GPU readings (" + readings->gpu_error() + "); the VRAM-release wait is skipped");
    supervisor::SupervisorOptions opt;
    opt.state_dir = dir;
    opt.log = log_line;
    supervisor::Supervisor sup(reg, store, *readings, std::move(probe), opt);

    gateway::GatewayOptions gopt;
    gopt.host = reg.server.listen_host;
    gopt.port = reg.server.listen_port;
    {
      const gateway::DescriptorLimit fds = gateway::raise_descriptor_limit();
      gopt.max_connections = gateway::connections_for_descriptors(fds.soft, http::ServerOptions{}.max_connections);
      log_line(gateway::describe(fds, gopt.max_connections));
    }
    gopt.admin_token = admin_token;
    gopt.admin_token_path = admin::admin_token_path(dir);
    // restore_reasoning's memory of each answer's reasoning, shared by every request (declared
    // before the gateway, which uses it until it stops); in memory only, bounded by its defaults
    // (policies/restore_reasoning.hpp: 4,096 keys, 64 MiB of text, 6 h expiry).
    policies::ReasoningStore reasoning;
    gateway::Gateway gw(reg, store, sup, gopt);
    gw.set_reasoning_store(&reasoning);
    gw.set_recovering(true);
    admin::AdminContext ctx;
    ctx.supervisor = &sup;
    ctx.registry = &reg;
    ctx.store = &store;
    ctx.readings = readings.get();
    ctx.post_blocking = [&gw](std::function<void()> fn) { return gw.post_blocking(std::move(fn)); };
    ctx.on_progress = [](const std::string& line) {
      log_line(line);
      service::notify_status(line);
    };
    ctx.daemon_info = [&gw, &reg, config, dir] {
      return nlohmann::json{{"pid", static_cast<int64_t>(getpid())}, {"config", config}, {"state_dir", dir},
                            {"listen", reg.server.listen_host + ":" + std::to_string(gw.port())}};
    };
    for (auto& r : admin::admin_routes(ctx)) gw.add_route(r.method, r.path, r.handler);
    gw.start();
    write_daemon_file(dir, reg.server.listen_host, gw.port(), config);
    log_line("listening on " + reg.server.listen_host + ":" + std::to_string(gw.port()) + " (state " + dir + ")");
    service::notify_ready("listening on port " + std::to_string(gw.port()));
    service::Watchdog watchdog;

    // Recovery (adopting an engine a previous daemon left: its health wait and warm-up) and the
    // default model's start run here, while the gateway already answers.
    std::thread starter([&sup, &gw, def = reg.server.default_model] {
      try {
        sup.recover(log_line);
      } catch (const std::exception& e) {
        log_line(std::string("recovery of the previous daemon's engine failed: ") + e.what());
      }
      gw.set_recovering(false);
      if (def.empty()) return;
      auto snap = sup.snapshot();
      if (snap.state == gateway::SlotState::ready && snap.model == def) return;
      // A failure here is the default model's start only: the daemon keeps serving.
      try {
        service::notify_status("starting " + def);
        auto r = sup.switch_to(def, [](const std::string& l) {
          log_line(l);
          service::notify_status(l);
        });
        if (r.ok) service::notify_status(def + " ready");
        else log_line("default model " + def + " did not start: " + r.error);
      } catch (const std::exception& e) {
        log_line("default model " + def + " did not start: " + e.what());
      }
    });

    int sig = 0;
    for (;;) {
      sigwait(&stop_signals, &sig);
      if (sig != SIGHUP) break;
      log_line("received SIGHUP: ignored (the daemon keeps serving; models.toml is read at the next start)");
    }
    log_line(std::string("received ") + (sig == SIGTERM ? "SIGTERM" : "SIGINT") +
             ": stopping the gateway, then the engine");
    service::notify_stopping();
    sup.begin_shutdown();  // a start in progress gives up
    gw.stop();
    if (starter.joinable()) starter.join();
    auto r = sup.stop("daemon shutdown", log_line);
    std::error_code ec;
    std::filesystem::remove(daemon_file(dir), ec);
    admin::remove_admin_token(dir, admin_token);
    if (!r.ok) {
      log_line("engine stop failed: " + r.error);
      return 1;
    }
    log_line("stopped");
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "servedeck: serve: " << e.what() << "\n";
    std::error_code ec;
    std::filesystem::remove(daemon_file(dir), ec);
    return 1;
  }
}

}  // namespace servedeck::cli
