// Supervisor operations: switch, launch and ready wait, a failed start, the measured-memory
// record. The switch queue is supervisor_queue.cpp; stopping an engine, the launch blocker and
// the /dev/shm reap are supervisor_stop.cpp; status, leases and the exit monitor are
// supervisor_watch.cpp; probes after ready are supervisor_liveness.cpp; daemon-start recovery is
// supervisor_recover.cpp.
#include "gateway/supervisor/supervisor.hpp"

#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <iostream>
#include <sstream>

#include "gateway/supervisor/engine_identity.hpp"
#include "gateway/supervisor/holders.hpp"
#include "gateway/supervisor/supervisor_internal.hpp"
#include "registry/registry.hpp"

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
using detail::exit_phrase;
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
  if (s != SlotState::ready && s != SlotState::unhealthy) draining_ = false;
}

void Supervisor::log(const std::string& line) const {
  if (opt_.log) {
    opt_.log(line);
    return;
  }
  std::cerr << "servedeck: " << line << std::endl;
}

void Supervisor::record_event(std::string_view kind, const std::string& model, const nlohmann::json& detail) {
  try {
    store_.add_event(kind, model, detail);
  } catch (const std::exception& e) {
    log("could not record a '" + std::string(kind) + "' event for " + (model.empty() ? "the slot" : model) +
        " in the state store: " + utf8_excerpt(e.what()));
  }
}

OpResult Supervisor::switch_locked(const std::string& model, const Progress& progress) {
  auto t0 = Clock::now();
  const registry::ModelEntry* m = resolve(model);
  if (!m) {
    std::string known;
    for (const auto& e : reg_.models) known += (known.empty() ? "" : ", ") + e.name;
    return {false, "unknown model '" + model + "' (registry " + reg_.path + " has: " + known + ")", 0};
  }
  std::lock_guard op(op_mu_);
  std::string previous;
  bool already = false;
  {
    std::lock_guard lk(mu_);
    already = state_ == SlotState::ready && model_ == m->name && engine_ && engine_->running();
    if (already) grant_leases_locked(m->name);
    else if (state_ == SlotState::ready) previous = model_;
    if (!already) switching_to_ = m->name;
  }
  if (already) {
    say(progress, m->name + " is already ready");
    return {true, "", seconds_since(t0)};
  }
  struct ClearSwitching {  // also when an exception leaves the switch
    Supervisor* s;
    ~ClearSwitching() {
      std::lock_guard lk(s->mu_);
      s->switching_to_.clear();
    }
  } clear{this};
  record_event("switch", m->name, {{"from", previous}});
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
  std::string stopped;  // the model whose engine (or leftovers) the stop below ends
  {
    std::lock_guard lk(mu_);
    have_engine = engine_ != nullptr || state_ != SlotState::stopped;
    if (state_ == SlotState::ready) running = model_;
    stopped = model_;
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
  reap({stopped, m.name}, progress);
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
  record_event("preflight", m.name, report.to_json());
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
  record_event("preflight", m.name, detail);
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
  rec.id = store_.begin_launch(rec);  // a store failure here ends the switch before anything runs
  {
    std::lock_guard lk(mu_);
    record_ = rec;
  }
  // A launch that ends before its engine runs: recorded failed, slot failed, nothing to stop.
  auto refuse = [&](const std::string& why) {
    rec.state = "failed";
    rec.why = why;
    rec.stop_ms = state::now_ms();
    store_.update_launch(rec);
    {
      std::lock_guard lk(mu_);
      record_ = rec;
    }
    set_state(SlotState::failed, why);
    record_event("error", m.name, {{"launch", rec.id}, {"why", why}});
    say(progress, "start failed: " + why);
    return OpResult{false, why, 0};
  };

  std::shared_ptr<LaunchLog> log;
  try {
    log = std::make_shared<LaunchLog>(opt_.state_dir, m.name, rec.id, reg_.server.log_max_bytes,
                                      reg_.server.log_keep);
  } catch (const std::exception& e) {
    return refuse(e.what());
  }
  rec.log_path = log->path();
  std::string cmdline;
  for (const auto& a : spec.argv) cmdline += (cmdline.empty() ? "" : " ") + a;
  log->note("launch " + std::to_string(rec.id) + " of " + m.name + ": " + cmdline);
  // A fixed port someone else listens on: the engine would only print "Address already in use".
  if (m.port != 0)
    if (std::string held = describe_port_holders(rec.port); !held.empty())
      return refuse("cannot start " + m.name + ": " + held);

  const std::string tag = launch_tag(opt_.state_dir, rec.id);
  std::shared_ptr<EngineCgroup> cgroup;
  std::string no_cgroup = cgroup_unavailable_;
  if (!cgroup_parent_.empty()) cgroup = EngineCgroup::create(cgroup_parent_, launch_cgroup_name(tag), &no_cgroup);
  std::shared_ptr<EngineProcess> engine;
  try {
    engine = EngineProcess::spawn({spec.program, spec.argv, spec.env, log->fd(), tag, cgroup});
  } catch (const SpawnError& e) {
    if (cgroup) cgroup->remove();
    return refuse(e.what());
  }
  if (!engine->cgroup_warning().empty()) no_cgroup = engine->cgroup_warning();
  log->note(engine->identity().cgroup
                ? "launch " + std::to_string(rec.id) + " runs in cgroup " + engine->identity().cgroup->path()
                : "launch " + std::to_string(rec.id) + " runs without a cgroup (" + no_cgroup +
                      "); its processes are found through its session and " + k_launch_marker_var + "=" + tag);
  rec.pid = engine->pid();
  rec.pid_start_time = static_cast<int64_t>(engine->start_time());
  {
    // The slot owns the engine before anything else can fail: a failure from here on stops it.
    std::lock_guard lk(mu_);
    record_ = rec;
    engine_ = engine;
    log_ = log;
    host_ = spec.host.empty() ? m.host : spec.host;
    port_ = rec.port;
    model_ = m.name;
  }
  store_.update_launch(rec);
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
  }
  store_.update_launch(rec);  // recorded ready before anyone is told it is
  {
    // Ready, and the leases of the callers waiting for this model, in one critical section.
    std::lock_guard lk(mu_);
    state_ = SlotState::ready;
    since_ms_ = ready_ms_ = state::now_ms();
    draining_ = false;
    last_error_.clear();
    last_exit_.clear();
    refused_model_.clear();  // a model is ready: an earlier refusal is history (the event keeps it)
    refusal_.clear();
    last_health_ms_ = last_probe_ms_ = since_ms_;
    {
      std::lock_guard ll(leases_->mu);
      leases_->last_active_ms = since_ms_;
    }
    grant_leases_locked(m.name);
  }
  log->note("ready in " + fmt_s(load_s) + " s");
  record_event("ready", m.name, {{"launch", rec.id}, {"load_s", load_s}});
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
      std::string why = "engine " + exit_phrase(engine, "during start");
      // A process outside the launch holding the port explains "Address already in use".
      if (std::string held = describe_port_holders(port); !held.empty()) why += "; " + held;
      return why;
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
    const auto probe_ms = std::max<int64_t>(1, std::min<int64_t>(opt_.health_probe_timeout_ms, remaining_ms));
    ProbeResult h = probe_health(host, port, m.health_path, static_cast<int>(probe_ms));
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
  std::string tail = log ? utf8_excerpt(tail_lines(log->path(), opt_.log_tail_lines)) : "";
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
    if (engine) last_exit_ = engine->exit_description();
    if (!t.clean()) {
      blocker_ = "engine of launch " + std::to_string(rec.id) + " (" + m.name +
                 ") survived SIGKILL: " + t.describe_survivors();
      for (const auto& s : t.survivors) blocker_pids_.push_back(s.stat.pid);
    } else {
      engine_.reset();
    }
  }
  if (rec.id) store_.update_launch(rec);
  record_event("error", m.name, {{"launch", rec.id}, {"why", why}});
  // Files of the launch that something still holds are named with their holder.
  ReapReport r = reap({m.name}, progress);
  for (const auto& k : r.kept) error += "\nstill held: " + k.path + " (" + k.why + ")";
  set_state(SlotState::failed, error);
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
