// Supervisor: construction, status, leases and the exit monitor (a ready engine that exits).
#include <sys/stat.h>

#include <chrono>

#include "gateway/supervisor/supervisor.hpp"
#include "gateway/supervisor/supervisor_internal.hpp"

namespace servedeck::supervisor {

Supervisor::Supervisor(const registry::Registry& reg, state::Store& store, preflight::Readings& readings,
                       std::unique_ptr<GpuMemoryProbe> gpu, SupervisorOptions opt)
    : reg_(reg), store_(store), readings_(readings), gpu_(std::move(gpu)), opt_(std::move(opt)) {
  since_ms_ = state::now_ms();
  if (!opt_.cgroup_parent) {
    if (auto parent = EngineCgroup::default_parent(&cgroup_unavailable_)) cgroup_parent_ = *parent;
  } else {
    cgroup_parent_ = *opt_.cgroup_parent;
    if (cgroup_parent_.empty()) cgroup_unavailable_ = "launch cgroups are turned off";
  }
  if (cgroup_parent_.empty())
    log("engines run without a launch cgroup (" + cgroup_unavailable_ +
        "); each launch's processes are found through its session and its " + k_launch_marker_var +
        " marker, which a descendant that replaces its whole environment loses");
  monitor_ = std::thread([this] { monitor_loop(); });
  liveness_ = std::thread([this] { liveness_loop(); });
  switcher_ = std::thread([this] { switch_loop(); });
}

void Supervisor::begin_shutdown() {
  {
    std::lock_guard lk(mu_);
    shutting_down_ = true;
  }
  shutdown_cv_.notify_all();
  queue_cv_.notify_all();
}

Supervisor::~Supervisor() {
  begin_shutdown();  // the switch thread tells every queued caller
  if (switcher_.joinable()) switcher_.join();
  if (liveness_.joinable()) liveness_.join();
  if (monitor_.joinable()) monitor_.join();
}

gateway::SlotSnapshot Supervisor::snapshot() const {
  std::lock_guard lk(mu_);
  gateway::SlotSnapshot s;
  s.state = state_;
  s.model = model_;
  s.host = state_ == SlotState::ready ? host_ : "";
  s.port = port_;
  s.pid = engine_ ? engine_->pid() : 0;
  s.launch_id = record_.id;
  s.since_ms = since_ms_;
  s.last_error = last_error_;
  s.switching_to = switching_to_;
  s.draining = draining_ && (state_ == SlotState::ready || state_ == SlotState::unhealthy);
  s.refused_model = refused_model_;
  s.refusal = refusal_;
  {
    std::lock_guard ll(leases_->mu);
    s.in_flight = leases_->count;
  }
  return s;
}

gateway::Lease Supervisor::acquire(const std::string& model) {
  const registry::ModelEntry* m = resolve(model);
  std::lock_guard lk(mu_);
  if (!m || state_ != SlotState::ready || draining_ || m->name != model_ || !engine_ || !engine_->running())
    return nullptr;
  return make_lease_locked();
}

void Supervisor::monitor_loop() {
  for (;;) {
    {
      std::unique_lock lk(mu_);
      shutdown_cv_.wait_for(lk, std::chrono::milliseconds(opt_.poll_ms), [this] { return shutting_down_; });
      if (shutting_down_) return;
    }
    try {
      monitor_tick();
    } catch (const std::exception& e) {
      log("monitor: " + utf8_excerpt(e.what()) + " (the monitor keeps running)");
      std::unique_lock lk(mu_);
      shutdown_cv_.wait_for(lk, std::chrono::seconds(1), [this] { return shutting_down_; });
    }
  }
}

void Supervisor::monitor_tick() {
  std::shared_ptr<EngineProcess> engine;
  std::shared_ptr<LaunchLog> launch_log;
  {
    std::lock_guard lk(mu_);
    if ((state_ != SlotState::ready && state_ != SlotState::unhealthy) || !engine_) return;
    engine = engine_;
    launch_log = log_;
  }
  // File I/O outside the supervisor's mutex: a copy-truncate of a 64 MiB log must not hold up
  // snapshot() and every request's acquire(). (While starting, wait_ready() bounds the log.)
  if (launch_log) launch_log->enforce_bound();
  if (engine->running()) return;
  // Liveness: the engine exited on its own.
  const std::string ended = detail::exit_phrase(*engine, "after ready");
  const std::string tail = launch_log ? utf8_excerpt(tail_lines(launch_log->path(), opt_.log_tail_lines)) : "";
  state::LaunchRecord rec;
  std::string model, why;
  {
    std::lock_guard lk(mu_);
    if (engine_ != engine || (state_ != SlotState::ready && state_ != SlotState::unhealthy)) return;
    why = "engine " + model_ + " (pid " + std::to_string(engine->pid()) + ") " + ended;
    record_.state = "failed";
    record_.why = why;
    record_.stop_ms = state::now_ms();
    record_.exit_status = engine->exit_status();
    rec = record_;
    model = model_;
    state_ = SlotState::failed;
    since_ms_ = state::now_ms();
    draining_ = false;
    last_exit_ = engine->exit_description();
    last_error_ = why + (tail.empty() ? "" : "\n--- engine log tail ---\n" + tail);
  }
  log(why);
  try {
    store_.update_launch(rec);
  } catch (const std::exception& e) {
    log("could not record launch " + std::to_string(rec.id) + " as failed: " + utf8_excerpt(e.what()));
  }
  record_event("error", model, {{"launch", rec.id}, {"why", why}});
  // Whatever the engine left of its launch dies with it, unless an operation is already running
  // (it does the same); then the slot lets go of the dead engine.
  if (!op_mu_.try_lock()) return;
  std::lock_guard op(op_mu_, std::adopt_lock);
  auto t = terminate(*engine, std::chrono::seconds(2), std::chrono::milliseconds(opt_.kill_wait_ms));
  std::shared_ptr<Job> restart;
  {
    std::lock_guard lk(mu_);
    if (engine_ == engine) {
      if (t.clean()) {
        engine_.reset();
      } else {
        blocker_ = "engine " + model + " exited and left processes that survived SIGKILL: " + t.describe_survivors();
        blocker_pids_.clear();
        for (const auto& sv : t.survivors) blocker_pids_.push_back(sv.stat.pid);
      }
    }
    if (state_ == SlotState::failed && model_ == model) {
      std::string not_restarted;
      restart = maybe_restart_locked(model, &not_restarted);
      if (!not_restarted.empty()) last_error_ += "\n" + not_restarted;
    }
  }
  if (restart) {
    log("restart_on_failure: restarting " + model);
    submit(restart);
  }
}

nlohmann::json Supervisor::status_json() const {
  auto s = snapshot();
  std::shared_ptr<EngineProcess> engine;
  int64_t ready_ms = 0;
  std::string log_path, blocker, last_exit;
  state::LaunchRecord rec;
  {
    std::lock_guard lk(mu_);
    engine = engine_;
    last_exit = last_exit_;
    ready_ms = ready_ms_;
    log_path = log_ ? log_->path() : record_.log_path;
    blocker = blocker_;
    rec = record_;
  }
  // Live: an engine of this slot is up (or being started/stopped). A failed or stopped slot has
  // no live pid, port, uptime or memory; its last launch's pid/port/exit status are "last_*".
  const bool live = s.state == SlotState::ready || s.state == SlotState::unhealthy || s.state == SlotState::starting ||
                    s.state == SlotState::stopping;
  nlohmann::json j;
  j["slot"] = "main";
  j["state"] = std::string(gateway::to_string(s.state));
  j["model"] = s.model;
  j["pid"] = live ? s.pid : 0;
  j["port"] = live ? s.port : 0;
  j["launch_id"] = s.launch_id;
  j["since_ms"] = s.since_ms;
  j["last_error"] = s.last_error;
  j["switching_to"] = s.switching_to;
  j["in_flight"] = s.in_flight;
  // The last switch preflight refused before stopping the ready model (SlotSnapshot): the model
  // and its refused checks, one "check: message" per line; null when none is recorded.
  j["refused_model"] = s.refused_model.empty() ? nlohmann::json(nullptr) : nlohmann::json(s.refused_model);
  j["refusal"] = s.refused_model.empty() ? nlohmann::json(nullptr) : nlohmann::json(s.refusal);
  j["last_pid"] = rec.pid;
  j["last_port"] = rec.port;
  j["exit_status"] = rec.exit_status ? nlohmann::json(*rec.exit_status) : nlohmann::json(nullptr);
  // How the last engine ended: "killed by signal 9 (SIGKILL)", "exited with status 1".
  j["exit_reason"] = last_exit.empty() ? nlohmann::json(nullptr) : nlohmann::json(last_exit);
  j["draining"] = s.draining;
  j["cgroup"] = engine && engine->identity().cgroup ? nlohmann::json(engine->identity().cgroup->path())
                                                    : nlohmann::json(nullptr);
  if (cgroup_parent_.empty()) j["cgroup_unavailable"] = cgroup_unavailable_;
  if (s.state == SlotState::ready || s.state == SlotState::unhealthy)
    j["uptime_s"] = (state::now_ms() - ready_ms) / 1000.0;
  else if (live)
    j["uptime_s"] = 0.0;
  else
    j["uptime_s"] = nullptr;
  j["log_path"] = log_path;
  j["blocker"] = blocker;
  const registry::ModelEntry* m = reg_.find_by_name(s.model);
  j["ctx"] = m ? m->ctx : 0;
  j["served_name"] = m ? m->served_name : "";
  j["host_rss_gib"] = nullptr;
  j["vram_gib"] = nullptr;
  if (engine && live) {
    std::vector<int64_t> pids;
    int64_t rss = 0;
    for (const auto& p : engine->members()) {
      pids.push_back(p.pid);
      rss += read_vm_rss_kib(p.pid).value_or(0);
    }
    j["processes"] = pids.size();
    j["host_rss_gib"] = static_cast<double>(rss) / (1024.0 * 1024.0);
    if (gpu_)
      if (auto v = gpu_->used_mib(pids)) j["vram_gib"] = *v / 1024.0;
  }
  if (m)
    if (auto mm = store_.last_measured_memory(m->name, m->ctx))
      j["measured"] = {{"peak_vram_gib", mm->peak_vram_gib}, {"host_rss_gib", mm->host_rss_gib},
                       {"load_s", mm->load_s}, {"time_ms", mm->time_ms}};
  return j;
}

std::string Supervisor::log_path(const std::string& model) const {
  std::string wanted = model;
  {
    std::lock_guard lk(mu_);
    if (model.empty() || model == model_) {
      if (log_) return log_->path();
      if (!record_.log_path.empty()) return record_.log_path;
    }
    // The slot is about a model with no launch of its own now (e.g. refused by preflight after
    // the stop): its newest launch, never another model's log.
    if (wanted.empty()) wanted = model_;
  }
  const registry::ModelEntry* m = wanted.empty() ? nullptr : resolve(wanted);
  for (const auto& l : store_.recent_launches(200))
    if ((wanted.empty() || (m && l.model == m->name)) && !l.log_path.empty()) return l.log_path;
  return "";
}

}  // namespace servedeck::supervisor
