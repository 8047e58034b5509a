// Liveness after ready: the health probe every liveness_interval_s, the one-token completion
// after liveness_idle_s without a request, the proxy's first-byte reports, the `unhealthy` state
// and restart_on_failure. Exit detection is the monitor's (supervisor_watch.cpp).
#include <algorithm>
#include <chrono>

#include "gateway/supervisor/supervisor.hpp"
#include "gateway/supervisor/supervisor_internal.hpp"

namespace servedeck::supervisor {

namespace {

/// note: how often an unhealthy engine is probed for recovery when its model turned the health
/// probe off (liveness_interval_s = 0).
constexpr int64_t k_recheck_ms = 10000;

}  // namespace

void Supervisor::liveness_loop() {
  for (;;) {
    {
      std::unique_lock lk(mu_);
      shutdown_cv_.wait_for(lk, std::chrono::milliseconds(opt_.poll_ms),
                            [this] { return shutting_down_ || !unpublished_.empty(); });
      if (shutting_down_) return;
    }
    try {
      liveness_tick();
    } catch (const std::exception& e) {
      log("liveness: " + utf8_excerpt(e.what()) + " (the probes keep running)");
      std::unique_lock lk(mu_);
      shutdown_cv_.wait_for(lk, std::chrono::seconds(1), [this] { return shutting_down_; });
    }
  }
}

void Supervisor::liveness_tick() {
  std::vector<Unhealthy> reported;
  {
    std::lock_guard lk(mu_);
    reported.swap(unpublished_);
  }
  for (const auto& u : reported) publish_unhealthy(u);
  struct Plan {
    bool health = false;
    bool completion = false;
    std::string host, health_path, served_name;
    int port = 0;
    int timeout_ms = 0;
    int64_t launch_id = 0;
    std::shared_ptr<EngineProcess> engine;
  } plan;
  {
    std::lock_guard lk(mu_);
    if ((state_ != SlotState::ready && state_ != SlotState::unhealthy) || !engine_ || !engine_->running() || draining_)
      return;
    const registry::ModelEntry* m = reg_.find_by_name(model_);
    if (!m) return;
    const int64_t now = state::now_ms();
    const int64_t interval = int64_t{m->liveness_interval_s} * 1000;
    const int64_t idle = int64_t{m->liveness_idle_s} * 1000;
    int in_flight = 0;
    int64_t last_active = 0;
    {
      std::lock_guard ll(leases_->mu);
      in_flight = leases_->count;
      last_active = leases_->last_active_ms;
    }
    if (state_ == SlotState::ready) {
      plan.health = interval > 0 && now - last_health_ms_ >= interval;
      plan.completion = idle > 0 && in_flight == 0 && now - std::max(last_active, last_probe_ms_) >= idle;
    } else {
      // Unhealthy: both probes together decide whether it is ready again.
      const int64_t recheck = interval > 0 ? interval : k_recheck_ms;
      plan.health = plan.completion = now - std::max(last_health_ms_, last_probe_ms_) >= recheck;
    }
    if (!plan.health && !plan.completion) return;
    if (plan.health) last_health_ms_ = now;
    if (plan.completion) last_probe_ms_ = now;
    plan.host = host_.empty() ? "127.0.0.1" : host_;
    plan.port = port_;
    plan.health_path = m->health_path;
    plan.served_name = m->served_name;
    plan.timeout_ms = m->liveness_timeout_s * 1000;
    plan.launch_id = record_.id;
    plan.engine = engine_;
  }
  // The probes run without the mutex: each may take up to liveness_timeout_s.
  std::string failure;
  if (plan.health) {
    ProbeResult h = probe_health(plan.host, plan.port, plan.health_path, plan.timeout_ms);
    if (!h.ok)
      failure = "liveness: GET " + plan.health_path +
                (h.status ? " answered HTTP " + std::to_string(h.status) + ": " + h.detail
                          : " got no answer within " + std::to_string(plan.timeout_ms) + " ms (" + h.detail + ")");
  }
  if (failure.empty() && plan.completion) {
    ProbeResult w = probe_warmup(plan.host, plan.port, plan.served_name, plan.timeout_ms);
    if (!w.ok)
      failure = "liveness: a one-token completion " +
                (w.status ? "answered HTTP " + std::to_string(w.status) + ": " + w.detail
                          : "got no answer within " + std::to_string(plan.timeout_ms) + " ms (" + w.detail + ")");
  }
  Unhealthy u;
  std::string recovered;
  {
    std::lock_guard lk(mu_);
    if (record_.id != plan.launch_id || engine_ != plan.engine) return;  // another launch since
    if (!failure.empty()) {
      if (state_ == SlotState::ready) u = mark_unhealthy_locked(failure);
      else if (state_ == SlotState::unhealthy) last_error_ = failure;
    } else if (state_ == SlotState::unhealthy && plan.health && plan.completion) {
      recovered = model_;
      state_ = SlotState::ready;
      since_ms_ = state::now_ms();
      last_error_.clear();
    }
  }
  if (!u.why.empty()) publish_unhealthy(u);
  if (!recovered.empty()) {
    log(recovered + " answers its liveness probes again: ready");
    record_event("healthy", recovered, {{"launch", plan.launch_id}});
  }
}

Supervisor::Unhealthy Supervisor::mark_unhealthy_locked(const std::string& why) {
  Unhealthy u;
  u.model = model_;
  u.launch_id = record_.id;
  u.why = why;
  u.log = log_;
  state_ = SlotState::unhealthy;
  since_ms_ = state::now_ms();
  last_error_ = why;
  std::string not_restarted;
  u.restart = maybe_restart_locked(model_, &not_restarted);
  if (!not_restarted.empty()) last_error_ += "\n" + not_restarted;
  return u;
}

void Supervisor::publish_unhealthy(const Unhealthy& u) {
  log(u.model + " is unhealthy: " + u.why);
  if (u.log) u.log->note("unhealthy: " + u.why);
  record_event("unhealthy", u.model, {{"launch", u.launch_id}, {"why", u.why}});
  if (u.restart) {
    log("restart_on_failure: restarting " + u.model);
    submit(u.restart);
  }
}

std::shared_ptr<Supervisor::Job> Supervisor::maybe_restart_locked(const std::string& model, std::string* why_not) {
  const registry::ModelEntry* m = reg_.find_by_name(model);
  if (!m || !m->restart_on_failure || shutting_down_) return nullptr;
  if (current_ || !queue_.empty()) return nullptr;  // the operation on its way replaces the engine anyway
  const int64_t now = state::now_ms();
  auto& times = auto_restarts_[model];
  times.erase(std::remove_if(times.begin(), times.end(),
                             [&](int64_t t) { return now - t > int64_t{k_auto_restart_window_s} * 1000; }),
              times.end());
  if (static_cast<int>(times.size()) >= k_max_auto_restarts) {
    if (why_not)
      *why_not = "restart_on_failure: " + std::to_string(times.size()) + " automatic restarts of " + model +
                 " in the last " + std::to_string(k_auto_restart_window_s) + " s; not restarting again";
    return nullptr;
  }
  times.push_back(now);
  auto job = std::make_shared<Job>();
  job->target = model;
  return job;
}

void Supervisor::report_unresponsive(const std::string& model, int port, const std::string& why) {
  const registry::ModelEntry* m = resolve(model);
  if (!m) return;
  // Called on a gateway I/O thread: only the state changes here; the log lines, the event (a
  // SQLite write) and a restart are left to the liveness thread's next tick.
  std::lock_guard lk(mu_);
  if (state_ != SlotState::ready || model_ != m->name || port_ != port || !engine_) return;
  unpublished_.push_back(
      mark_unhealthy_locked("a proxied request got no first byte in time: " + utf8_excerpt(why, 500)));
  shutdown_cv_.notify_all();  // wakes the liveness thread
}

}  // namespace servedeck::supervisor
