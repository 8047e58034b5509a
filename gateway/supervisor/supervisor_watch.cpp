// Supervisor: construction, status, leases, ensure_running's switch thread, the liveness monitor
// and daemon-start recovery (adopt or reap).
#include <sys/stat.h>

#include <chrono>

#include "gateway/supervisor/supervisor.hpp"

namespace servedeck::supervisor {

Supervisor::Supervisor(const registry::Registry& reg, state::Store& store, preflight::Readings& readings,
                       std::unique_ptr<GpuMemoryProbe> gpu, SupervisorOptions opt)
    : reg_(reg), store_(store), readings_(readings), gpu_(std::move(gpu)), opt_(std::move(opt)) {
  since_ms_ = state::now_ms();
  monitor_ = std::thread([this] { monitor_loop(); });
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
  begin_shutdown();
  if (switcher_.joinable()) switcher_.join();
  if (monitor_.joinable()) monitor_.join();
  // Callers still waiting on ensure_running hear about the shutdown.
  for (auto& [model, dones] : waiting_)
    for (auto& d : dones) d(false, "the daemon is shutting down");
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
  auto counter = leases_;
  {
    std::lock_guard ll(counter->mu);
    ++counter->count;
  }
  // The deleter only touches the counter (shared), so a lease may safely outlive a switch.
  return gateway::Lease(static_cast<void*>(counter.get()), [counter](void*) {
    {
      std::lock_guard ll(counter->mu);
      --counter->count;
    }
    counter->cv.notify_all();
  });
}

void Supervisor::ensure_running(const std::string& model, std::function<void(bool ok, std::string error)> done) {
  const registry::ModelEntry* m = resolve(model);
  if (!m) {
    std::thread([done, model] { done(false, "unknown model '" + model + "'"); }).detach();
    return;
  }
  std::lock_guard lk(mu_);
  if (shutting_down_) {
    std::thread([done] { done(false, "the daemon is shutting down"); }).detach();
    return;
  }
  auto& list = waiting_[m->name];
  list.push_back(std::move(done));
  if (list.size() == 1) queue_.push_back(m->name);  // concurrent calls for one model share one switch
  queue_cv_.notify_all();
}

void Supervisor::switch_loop() {
  for (;;) {
    std::string target;
    {
      std::unique_lock lk(mu_);
      queue_cv_.wait(lk, [this] { return shutting_down_ || !queue_.empty(); });
      if (shutting_down_) return;
      target = queue_.front();
      queue_.pop_front();
    }
    OpResult r = switch_for_request(target);
    std::vector<std::function<void(bool, std::string)>> dones;
    {
      std::lock_guard lk(mu_);
      dones = std::move(waiting_[target]);
      waiting_.erase(target);
    }
    for (auto& d : dones) d(r.ok, r.error);
  }
}

OpResult Supervisor::switch_for_request(const std::string& model, const Progress& progress) {
  const registry::ModelEntry* target = resolve(model);
  std::unique_lock lk(mu_);
  if (target && state_ == SlotState::ready && model_ != target->name) {
    if (const auto* running = reg_.find_by_name(model_); running && running->min_residency_s > 0) {
      int64_t until = ready_ms_ + int64_t{running->min_residency_s} * 1000;
      int64_t wait_ms = until - state::now_ms();
      if (wait_ms > 0) {
        if (progress)
          progress("waiting " + std::to_string(wait_ms) + " ms: " + model_ + " has min_residency_s = " +
                   std::to_string(running->min_residency_s));
        shutdown_cv_.wait_for(lk, std::chrono::milliseconds(wait_ms), [this] { return shutting_down_; });
        if (shutting_down_) return {false, "the daemon is shutting down", 0};
      }
    }
  }
  lk.unlock();
  return switch_to(model, progress);
}

void Supervisor::monitor_loop() {
  std::unique_lock lk(mu_);
  while (!shutting_down_) {
    shutdown_cv_.wait_for(lk, std::chrono::milliseconds(opt_.poll_ms), [this] { return shutting_down_; });
    if (shutting_down_) return;
    // While starting, wait_ready() bounds the log (a LaunchLog has one user at a time).
    if (state_ == SlotState::ready && log_) log_->enforce_bound();
    if (state_ != SlotState::ready || !engine_ || engine_->running()) continue;
    // Liveness: the ready engine exited on its own.
    auto engine = engine_;
    auto st = engine->exit_status();
    std::string why = "engine " + model_ + " (pid " + std::to_string(engine->pid()) + ") exited after ready" +
                      (st ? " with status " + std::to_string(*st) : std::string());
    std::string tail = log_ ? tail_lines(log_->path(), opt_.log_tail_lines) : "";
    record_.state = "failed";
    record_.why = why;
    record_.stop_ms = state::now_ms();
    record_.exit_status = st;
    auto rec = record_;
    auto model = model_;
    state_ = SlotState::failed;
    since_ms_ = state::now_ms();
    last_error_ = why + (tail.empty() ? "" : "\n--- engine log tail ---\n" + tail);
    lk.unlock();
    try {
      store_.update_launch(rec);
      store_.add_event("error", model, {{"launch", rec.id}, {"why", why}});
    } catch (const std::exception&) {
    }
    // Whatever the engine left in its session (workers) dies with it, unless an operation is
    // already running (it does the same).
    if (op_mu_.try_lock()) {
      terminate(*engine, std::chrono::seconds(2), std::chrono::milliseconds(opt_.kill_wait_ms));
      op_mu_.unlock();
    }
    lk.lock();
  }
}

void Supervisor::recover(const Progress& progress) {
  std::lock_guard op(op_mu_);
  auto say = [&](const std::string& s) {
    if (progress) progress(s);
  };
  auto launches = store_.unfinished_launches();
  bool adopted = false;
  for (auto it = launches.rbegin(); it != launches.rend(); ++it) {
    state::LaunchRecord rec = *it;
    const registry::ModelEntry* m = reg_.find_by_name(rec.model);
    auto engine = rec.pid > 0 ? EngineProcess::adopt(rec.pid, static_cast<uint64_t>(rec.pid_start_time)) : nullptr;
    if (engine && m && !adopted) {
      say("adopting " + rec.model + " (launch " + std::to_string(rec.id) + ", pid " + std::to_string(rec.pid) + ")");
      auto log = std::make_shared<LaunchLog>(rec.log_path, reg_.server.log_max_bytes);
      {
        std::lock_guard lk(mu_);
        engine_ = engine;
        log_ = log;
        record_ = rec;
        model_ = rec.model;
        host_ = m->host;
        port_ = rec.port;
      }
      set_state(SlotState::starting);
      std::string why = wait_ready(*m, *engine, *log, rec.port, progress);
      if (why.empty()) {
        adopted = true;
        {
          std::lock_guard lk(mu_);
          record_.state = "ready";
          if (!record_.ready_ms) record_.ready_ms = state::now_ms();
          rec = record_;
        }
        store_.update_launch(rec);
        set_state(SlotState::ready);
        store_.add_event("adopt", rec.model, {{"launch", rec.id}, {"pid", rec.pid}});
        say("adopted " + rec.model + ": ready");
      } else {
        fail_start(*m, "adopted engine not ready: " + why, progress);
      }
      continue;
    }
    // Not adoptable: kill what is left of its session, mark it ended.
    std::string why;
    if (engine) {
      why = m ? "a newer launch was adopted" : "model '" + rec.model + "' is no longer in the registry";
      auto t = terminate(*engine, std::chrono::seconds(m ? m->stop_timeout_s : 10),
                         std::chrono::milliseconds(opt_.kill_wait_ms), progress);
      rec.exit_status = t.exit_status;
    } else if (auto st = read_proc_stat(rec.pid); !st || st->start_time == static_cast<uint64_t>(rec.pid_start_time)) {
      // Gone, or a zombie of the same process: what is left of its group/session dies.
      auto t = terminate_orphans(rec.pid, std::chrono::seconds(m ? m->stop_timeout_s : 10),
                                 std::chrono::milliseconds(opt_.kill_wait_ms));
      why = "engine pid " + std::to_string(rec.pid) + " gone at daemon start";
      if (!t.pids_seen.empty())
        why += "; killed " + std::to_string(t.pids_seen.size()) + " leftover process(es) of its session";
    } else {
      // The pid exists with another start time: reused by an unrelated process. The kernel does
      // not reuse a pid while it names a live group or session, so nothing of the engine is left.
      why = "engine pid " + std::to_string(rec.pid) + " gone at daemon start (pid now reused)";
    }
    rec.state = "stopped";
    rec.why = why;
    if (!rec.stop_ms) rec.stop_ms = state::now_ms();
    store_.update_launch(rec);
    store_.add_event("reap", rec.model, {{"launch", rec.id}, {"why", why}});
    say("reaped launch " + std::to_string(rec.id) + " of " + rec.model + ": " + why);
  }
  reap(progress);
}

nlohmann::json Supervisor::status_json() const {
  auto s = snapshot();
  std::shared_ptr<EngineProcess> engine;
  int64_t ready_ms = 0;
  std::string log_path, blocker;
  state::LaunchRecord rec;
  {
    std::lock_guard lk(mu_);
    engine = engine_;
    ready_ms = ready_ms_;
    log_path = log_ ? log_->path() : record_.log_path;
    blocker = blocker_;
    rec = record_;
  }
  // Live: an engine of this slot is up (or being started/stopped). A failed or stopped slot has
  // no live pid, port, uptime or memory; its last launch's pid/port/exit status are "last_*".
  const bool live = s.state == SlotState::ready || s.state == SlotState::starting || s.state == SlotState::stopping;
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
  if (s.state == SlotState::ready)
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
