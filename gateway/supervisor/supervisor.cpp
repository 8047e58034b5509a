// Supervisor operations: switch, launch and ready wait, a failed start, the measured-memory
// record. Stopping an engine, the launch blocker and the /dev/shm reap are in
// supervisor_stop.cpp; status, leases, the liveness monitor and daemon-start recovery are in
// supervisor_watch.cpp.
#include "gateway/supervisor/supervisor.hpp"

#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <sstream>

#include "registry/registry.hpp"
#include "gateway/supervisor/supervisor_internal.hpp"

namespace servedeck::supervisor {

namespace {

/// A free TCP port on 127.0.0.1 (bind to 0, read it, close). A small race with other binders
/// remains; the engine then fails to bind and the start fails with its log tail.
int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return 0;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  int port = 0;
  socklen_t len = sizeof a;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0)
    port = ntohs(a.sin_port);
  ::close(fd);
  return port;
}

/// The last non-empty line of the log, for load progress lines.
std::string last_line(const std::string& path) {
  std::string t = tail_lines(path, 1);
  while (!t.empty() && (t.back() == '\r' || t.back() == '\n')) t.pop_back();
  if (t.size() > 200) t = t.substr(0, 200) + "…";
  return t;
}

}  // namespace

using detail::Clock;
using detail::fmt_s;
using detail::say;
using detail::seconds_since;

const registry::ModelEntry* Supervisor::resolve(const std::string& model) const {
  if (auto* m = reg_.find_by_name(model)) return m;
  return reg_.find_by_id(model);
}

void Supervisor::set_state(SlotState s, const std::string& error) {
  std::lock_guard lk(mu_);
  state_ = s;
  since_ms_ = state::now_ms();
  if (s == SlotState::failed) last_error_ = error;
  if (s == SlotState::ready) ready_ms_ = since_ms_;
  if (s != SlotState::ready) draining_ = false;
}

OpResult Supervisor::switch_to(const std::string& model, const Progress& progress) {
  auto t0 = Clock::now();
  const registry::ModelEntry* m = resolve(model);
  if (!m) {
    std::string known;
    for (const auto& e : reg_.models) known += (known.empty() ? "" : ", ") + e.name;
    return {false, "unknown model '" + model + "' (registry " + reg_.path + " has: " + known + ")", 0};
  }
  std::lock_guard op(op_mu_);
  std::string previous;
  {
    std::lock_guard lk(mu_);
    if (state_ == SlotState::ready && model_ == m->name && engine_ && engine_->running()) {
      say(progress, m->name + " is already ready");
      return {true, "", seconds_since(t0)};
    }
    if (state_ == SlotState::ready) previous = model_;
    switching_to_ = m->name;
  }
  store_.add_event("switch", m->name, {{"from", previous}});
  OpResult r = do_switch(*m, progress);
  if (!r.ok && !r.refused_before_stop && reg_.server.restore_previous_on_failed_start && !previous.empty() &&
      previous != m->name) {
    if (const auto* prev = reg_.find_by_name(previous)) {
      say(progress, "restoring the previous model " + previous + " (restore_previous_on_failed_start)");
      {
        std::lock_guard lk(mu_);
        switching_to_ = previous;
      }
      OpResult back = do_switch(*prev, progress);
      r.error += back.ok ? "\n(previous model " + previous + " restored)"
                         : "\n(restoring " + previous + " failed too: " + back.error + ")";
    }
  }
  {
    std::lock_guard lk(mu_);
    switching_to_.clear();
  }
  r.seconds = seconds_since(t0);
  return r;
}

OpResult Supervisor::do_switch(const registry::ModelEntry& m, const Progress& progress) {
  auto t0 = Clock::now();
  if (std::string b = check_blocker(); !b.empty()) {
    say(progress, "blocked: " + b);
    return {false, b, 0};
  }
  bool have_engine = false;
  std::string running;  // the ready model this switch would take down
  {
    std::lock_guard lk(mu_);
    have_engine = engine_ != nullptr || state_ != SlotState::stopped;
    if (state_ == SlotState::ready) running = model_;
  }
  int port = m.port != 0 ? m.port : free_port();
  if (!running.empty())
    if (auto refused = preflight_before_stop(m, running, port, progress)) {
      refused->seconds = seconds_since(t0);
      return *refused;
    }
  if (have_engine) {
    if (std::string e = stop_engine("switch to " + m.name, true, progress); !e.empty())
      return {false, e, seconds_since(t0)};
  }
  reap(progress);
  // A fresh port for the launch: the one picked before the drain may have been taken since.
  if (m.port == 0 && have_engine) port = free_port();

  set_state(SlotState::preflight);
  {
    // The slot is now about `m`, which has no launch yet: the last launch's record and log
    // (already written to the store) are not its own.
    std::lock_guard lk(mu_);
    model_ = m.name;
    record_ = {};
    log_.reset();
    port_ = 0;
  }
  say(progress, "preflight " + m.name + " (port " + std::to_string(port) + ")");
  preflight::Report report;
  try {
    report = opt_.preflight ? opt_.preflight(m, port) : preflight::run_preflight(reg_, m, readings_, port);
  } catch (const std::exception& e) {
    std::string why = "preflight of " + m.name + " failed to run: " + e.what();
    set_state(SlotState::failed, why);
    return {false, why, seconds_since(t0)};
  }
  std::string table = report.table();
  std::istringstream lines(table);
  for (std::string line; std::getline(lines, line);) say(progress, "preflight: " + line);
  store_.add_event("preflight", m.name, report.to_json());
  if (report.refused()) {
    std::string why = "preflight refused " + m.name + ":\n" + table;
    set_state(SlotState::failed, why);
    return {false, why, seconds_since(t0)};
  }
  {
    std::lock_guard lk(mu_);
    record_ = {};
    record_.preflight = report.to_json();
    record_.port = port;
  }
  OpResult r = launch(m, progress);
  r.seconds = seconds_since(t0);
  return r;
}

std::optional<OpResult> Supervisor::preflight_before_stop(const registry::ModelEntry& m, const std::string& running,
                                                          int port, const Progress& progress) {
  preflight::Report report;
  std::string why;
  try {
    // Only the declaration checks: the machine checks (free VRAM, MemAvailable, /dev/shm, other
    // CUDA processes) would read what `running` holds and run after the stop.
    report = opt_.preflight ? preflight::declaration_rows(opt_.preflight(m, port))
                            : preflight::run_preflight(reg_, m, readings_, port, std::nullopt,
                                                       preflight::Scope::declaration_only);
  } catch (const std::exception& e) {
    why = "preflight of " + m.name + " failed to run: " + e.what();
  }
  if (why.empty() && !report.refused()) {
    {
      std::lock_guard lk(mu_);
      if (refused_model_ == m.name) {  // the refusal no longer holds
        refused_model_.clear();
        refusal_.clear();
      }
    }
    say(progress, "preflight " + m.name + " before stopping " + running + ": " + std::to_string(report.checks.size()) +
                      " declaration checks, no refusal");
    return std::nullopt;
  }
  nlohmann::json detail;
  std::string refusal = why;  // the preflight failed to run: that error
  if (why.empty()) {
    refusal = report.refusals();
    std::string table = report.table();
    std::istringstream lines(table);
    for (std::string line; std::getline(lines, line);) say(progress, "preflight: " + line);
    why = "preflight refused " + m.name + " before stopping " + running + " (" + running +
          " is still ready and serving):\n" + table;
    detail = report.to_json();
  } else {
    detail = {{"model", m.name}, {"refused", true}, {"error", why}};
  }
  detail["before_stop"] = true;
  detail["kept_running"] = running;
  store_.add_event("preflight", m.name, detail);
  {
    std::lock_guard lk(mu_);
    last_error_ = why;  // the slot stays ready: its state, model, engine and log are untouched
    refused_model_ = m.name;
    refusal_ = refusal;
  }
  say(progress, "switch to " + m.name + " refused; " + running + " is still ready");
  OpResult r{false, why, 0};
  r.refused_before_stop = true;
  return r;
}

OpResult Supervisor::launch(const registry::ModelEntry& m, const Progress& progress) {
  auto t0 = Clock::now();
  state::LaunchRecord rec;
  {
    std::lock_guard lk(mu_);
    rec = record_;
  }
  registry::LaunchSpec spec;
  try {
    spec = registry::render_launch(m, rec.port, reg_.server);
  } catch (const std::exception& e) {
    std::string why = "rendering the launch of " + m.name + " failed: " + e.what();
    set_state(SlotState::failed, why);
    return {false, why, 0};
  }
  rec.model = m.name;
  rec.argv = spec.argv;
  rec.env = spec.env;
  rec.start_ms = state::now_ms();
  rec.state = "starting";
  rec.port = spec.port != 0 ? spec.port : rec.port;
  rec.id = store_.begin_launch(rec);

  std::shared_ptr<LaunchLog> log;
  try {
    log = std::make_shared<LaunchLog>(opt_.state_dir, m.name, rec.id, reg_.server.log_max_bytes,
                                      reg_.server.log_keep);
  } catch (const std::exception& e) {
    rec.state = "failed";
    rec.why = e.what();
    store_.update_launch(rec);
    set_state(SlotState::failed, rec.why);
    return {false, rec.why, 0};
  }
  rec.log_path = log->path();
  std::string cmdline;
  for (const auto& a : spec.argv) cmdline += (cmdline.empty() ? "" : " ") + a;
  log->note("launch " + std::to_string(rec.id) + " of " + m.name + ": " + cmdline);

  std::shared_ptr<EngineProcess> engine;
  try {
    engine = EngineProcess::spawn({spec.program, spec.argv, spec.env, log->fd()});
  } catch (const SpawnError& e) {
    rec.state = "failed";
    rec.why = e.what();
    rec.stop_ms = state::now_ms();
    store_.update_launch(rec);
    set_state(SlotState::failed, rec.why);
    store_.add_event("error", m.name, {{"launch", rec.id}, {"why", rec.why}});
    say(progress, "start failed: " + rec.why);
    return {false, rec.why, 0};
  }
  rec.pid = engine->pid();
  rec.pid_start_time = static_cast<int64_t>(engine->start_time());
  store_.update_launch(rec);
  {
    std::lock_guard lk(mu_);
    record_ = rec;
    engine_ = engine;
    log_ = log;
    host_ = spec.host.empty() ? m.host : spec.host;
    port_ = rec.port;
    model_ = m.name;
  }
  set_state(SlotState::starting);
  say(progress, "starting " + m.name + ": pid " + std::to_string(rec.pid) + ", port " + std::to_string(rec.port) +
                    ", log " + rec.log_path);

  std::string why = wait_ready(m, *engine, *log, rec.port, progress);
  if (!why.empty()) return fail_start(m, why, progress);

  double load_s = seconds_since(t0);
  {
    std::lock_guard lk(mu_);
    record_.ready_ms = state::now_ms();
    record_.state = "ready";
    rec = record_;
    last_error_.clear();
    refused_model_.clear();  // a model is ready: an earlier refusal is history (the event keeps it)
    refusal_.clear();
  }
  store_.update_launch(rec);
  set_state(SlotState::ready);
  log->note("ready in " + fmt_s(load_s) + " s");
  store_.add_event("ready", m.name, {{"launch", rec.id}, {"load_s", load_s}});
  record_measured_memory(m, load_s);
  say(progress, "ready in " + fmt_s(load_s) + " s");
  return {true, "", load_s};
}

std::string Supervisor::wait_ready(const registry::ModelEntry& m, EngineProcess& engine, LaunchLog& log,
                                   int port, const Progress& progress) {
  const auto start = Clock::now();
  const auto limit = std::chrono::seconds(std::max(1, m.start_timeout_s));
  const auto hard_cap = start + limit * k_max_start_extension;
  auto last_growth = start;
  int64_t last_bytes = log.bytes_written();
  auto last_emit = start - std::chrono::seconds(10);
  std::string host = m.host.empty() ? "127.0.0.1" : m.host;
  for (;;) {
    {
      std::lock_guard lk(mu_);
      if (shutting_down_) return "the daemon is shutting down";
    }
    if (abort_start_) return "start aborted by stop";
    if (!engine.running()) {
      auto st = engine.exit_status();
      return "engine exited during start" + (st ? " with status " + std::to_string(*st) : std::string());
    }
    log.enforce_bound();
    int64_t bytes = log.bytes_written();
    auto now = Clock::now();
    if (bytes != last_bytes) {
      last_bytes = bytes;
      last_growth = now;
      if (now - last_emit >= std::chrono::seconds(1)) {
        last_emit = now;
        if (auto line = last_line(log.path()); !line.empty()) say(progress, "loading: " + line);
      }
    }
    auto deadline = std::min(hard_cap, std::max(start + limit, last_growth + limit));
    if (now >= deadline) {
      return "not ready after " + fmt_s(seconds_since(start)) + " s: no health 200 on " + m.health_path +
             " (start_timeout_s = " + std::to_string(m.start_timeout_s) +
             ", extended while the log grew, at most " + std::to_string(k_max_start_extension) + "x)";
    }
    auto remaining_ms = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now).count();
    ProbeResult h = probe_health(host, port, m.health_path,
                                 static_cast<int>(std::min<int64_t>(opt_.health_probe_timeout_ms, remaining_ms)));
    if (h.ok) {
      if (!m.warmup) return "";
      say(progress, "health 200; warm-up: one-token completion");
      ProbeResult w = probe_warmup(host, port, m.served_name,
                                   static_cast<int>(std::max<int64_t>(1000, remaining_ms)));
      if (w.ok) return "";
      return "health answered 200 but the one-token warm-up failed (HTTP " + std::to_string(w.status) +
             "): " + w.detail;
    }
    std::unique_lock lk(mu_);
    shutdown_cv_.wait_for(lk, std::chrono::milliseconds(opt_.poll_ms), [this] { return shutting_down_; });
  }
}

OpResult Supervisor::fail_start(const registry::ModelEntry& m, const std::string& why, const Progress& progress) {
  say(progress, "start failed: " + why);
  std::shared_ptr<EngineProcess> engine;
  std::shared_ptr<LaunchLog> log;
  {
    std::lock_guard lk(mu_);
    engine = engine_;
    log = log_;
  }
  if (log) log->note("start failed: " + why);
  TerminateResult t;
  if (engine)
    t = terminate(*engine, std::chrono::seconds(std::max(0, m.stop_timeout_s)),
                  std::chrono::milliseconds(opt_.kill_wait_ms), progress);
  std::string tail = log ? tail_lines(log->path(), opt_.log_tail_lines) : "";
  std::string error = m.name + ": " + why;
  if (!tail.empty()) error += "\n--- engine log tail (" + (log ? log->path() : "") + ") ---\n" + tail;
  state::LaunchRecord rec;
  {
    std::lock_guard lk(mu_);
    record_.state = "failed";
    record_.why = why;
    record_.stop_ms = state::now_ms();
    record_.exit_status = t.exit_status;
    rec = record_;
    if (!t.clean()) {
      blocker_ = "engine of launch " + std::to_string(rec.id) + " (" + m.name +
                 ") survived SIGKILL: " + t.describe_survivors();
      for (const auto& s : t.survivors) blocker_pids_.push_back(s.stat.pid);
    } else {
      engine_.reset();
    }
  }
  if (rec.id) store_.update_launch(rec);
  store_.add_event("error", m.name, {{"launch", rec.id}, {"why", why}});
  set_state(SlotState::failed, error);
  reap(progress);
  return {false, error, 0};
}

void Supervisor::record_measured_memory(const registry::ModelEntry& m, double load_s) {
  std::shared_ptr<EngineProcess> engine;
  {
    std::lock_guard lk(mu_);
    engine = engine_;
  }
  if (!engine) return;
  state::MeasuredMemory mm;
  mm.model = m.name;
  mm.ctx = m.ctx;
  mm.load_s = load_s;
  struct stat st {};
  mm.engine_build = m.program;
  if (::stat(m.program.c_str(), &st) == 0) mm.engine_build += " mtime " + std::to_string(st.st_mtime);
  std::vector<int64_t> pids;
  int64_t rss_kib = 0;
  for (const auto& p : engine->members()) {
    pids.push_back(p.pid);
    rss_kib += read_vm_rss_kib(p.pid).value_or(0);
  }
  mm.host_rss_gib = static_cast<double>(rss_kib) / (1024.0 * 1024.0);
  if (gpu_)
    if (auto v = gpu_->used_mib(pids)) mm.peak_vram_gib = *v / 1024.0;
  try {
    store_.add_measured_memory(mm);
  } catch (const std::exception&) {
    // note: a measurement that cannot be written never fails a launch.
  }
}


}  // namespace servedeck::supervisor
