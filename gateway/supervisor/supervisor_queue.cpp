// The supervisor's switch queue: switch_to / switch_for_request / ensure_running / submit_*
// all end up here, and the switch thread runs one job at a time. Coalescing, superseding and
// the lease hand-over are described in supervisor.hpp.
#include <future>

#include "gateway/supervisor/supervisor.hpp"
#include "gateway/supervisor/supervisor_internal.hpp"

namespace servedeck::supervisor {

void Supervisor::submit(std::shared_ptr<Job> job) {
  std::vector<std::shared_ptr<Job>> superseded;
  bool refused = false;
  const std::string what = job->kind == Job::Kind::stop ? "stop" : "switch to " + job->target;
  {
    std::lock_guard lk(mu_);
    if (shutting_down_) {
      refused = true;
    } else {
      auto same = [&](const Job& j) {
        return j.kind == job->kind && (j.kind == Job::Kind::stop || j.target == job->target);
      };
      std::shared_ptr<Job> into;
      if (current_ && same(*current_)) into = current_;
      for (auto& q : queue_)
        if (!into && same(*q)) into = q;
      if (into) {
        // Joins: one load for every caller. An operator joining drops the residency wait.
        if (into->for_request && !job->for_request) {
          into->for_request = false;
          shutdown_cv_.notify_all();  // wakes the residency wait
        }
        std::lock_guard sl(subs_mu_);
        for (auto& s : job->subs) {
          if (s.wants_lease && into == current_ && into->ready_granted && state_ == SlotState::ready &&
              model_ == into->target && !draining_)
            s.lease = make_lease_locked();
          into->subs.push_back(std::move(s));
        }
      } else {
        // A new target (or a stop) supersedes everything queued; the running job finishes first,
        // except that a stop makes a start in progress give up.
        superseded.assign(queue_.begin(), queue_.end());
        queue_.clear();
        queue_.push_back(job);
        if (job->kind == Job::Kind::stop && current_ && current_->kind == Job::Kind::switch_model) {
          abort_start_ = true;
          shutdown_cv_.notify_all();  // a residency wait gives up too: nothing is launched
        }
        queue_cv_.notify_all();
      }
    }
  }
  if (refused) {
    OpResult r{false, "the daemon is shutting down", 0};
    for (auto& s : job->subs)
      if (s.done) s.done(r, nullptr);
  }
  for (auto& old : superseded) {
    OpResult r{false,
               (old->kind == Job::Kind::stop ? std::string("the stop") : "the switch to " + old->target) +
                   " was superseded by a later " + what + " before it began",
               0};
    for (auto& s : old->subs)
      if (s.done) s.done(r, nullptr);
  }
}

void Supervisor::job_progress(const Job& job, const std::string& line) {
  std::vector<Progress> sinks;
  {
    std::lock_guard sl(subs_mu_);
    for (const auto& s : job.subs)
      if (s.progress) sinks.push_back(s.progress);
  }
  for (auto& p : sinks) {
    try {
      p(line);
    } catch (const std::exception& e) {
      log("a progress listener failed (ignored): " + utf8_excerpt(e.what()));
    }
  }
}

gateway::Lease Supervisor::make_lease_locked() {
  auto counter = leases_;
  {
    std::lock_guard ll(counter->mu);
    ++counter->count;
    counter->last_active_ms = state::now_ms();
  }
  // The deleter only touches the counter (shared), so a lease may safely outlive a switch.
  return gateway::Lease(static_cast<void*>(counter.get()), [counter](void*) {
    {
      std::lock_guard ll(counter->mu);
      --counter->count;
      counter->last_active_ms = state::now_ms();
    }
    counter->cv.notify_all();
  });
}

void Supervisor::grant_leases_locked(const std::string& model) {
  if (!current_ || current_->kind != Job::Kind::switch_model || current_->target != model) return;
  current_->ready_granted = true;
  std::lock_guard sl(subs_mu_);
  for (auto& s : current_->subs)
    if (s.wants_lease && !s.lease) s.lease = make_lease_locked();
}

OpResult Supervisor::run_job(Job& job) {
  Progress progress = [this, &job](const std::string& line) { job_progress(job, line); };
  if (job.kind == Job::Kind::stop) {
    std::lock_guard op(op_mu_);
    abort_start_ = false;
    return stop_locked(job.why, progress);
  }
  // G28: a request-triggered switch first lets the running model serve its min_residency_s.
  const registry::ModelEntry* target = resolve(job.target);
  std::unique_lock lk(mu_);
  if (job.for_request && target && state_ == SlotState::ready && model_ != target->name) {
    if (const auto* running = reg_.find_by_name(model_); running && running->min_residency_s > 0) {
      const int64_t until = ready_ms_ + int64_t{running->min_residency_s} * 1000;
      if (int64_t wait_ms = until - state::now_ms(); wait_ms > 0) {
        const std::string line = "waiting " + std::to_string(wait_ms) + " ms: " + model_ +
                                 " has min_residency_s = " + std::to_string(running->min_residency_s);
        lk.unlock();
        progress(line);
        lk.lock();
        shutdown_cv_.wait_for(lk, std::chrono::milliseconds(wait_ms),
                              [&] { return shutting_down_ || !job.for_request || abort_start_; });
        if (shutting_down_) return {false, "the daemon is shutting down", 0};
        if (abort_start_) return {false, "the switch to " + job.target + " was cancelled by a stop before it began", 0};
      }
    }
  }
  lk.unlock();
  return switch_locked(job.target, progress);
}

void Supervisor::switch_loop() {
  for (;;) {
    std::shared_ptr<Job> job;
    {
      std::unique_lock lk(mu_);
      queue_cv_.wait(lk, [this] { return shutting_down_ || !queue_.empty(); });
      if (shutting_down_) break;
      job = queue_.front();
      queue_.pop_front();
      current_ = job;
      // A stop that asked the previous job to give up is either this job or was superseded by
      // it: either way the flag belonged to the job that just ended, never to this one.
      abort_start_ = false;
    }
    const std::string what = job->kind == Job::Kind::stop ? "stop" : "switch to " + job->target;
    OpResult r;
    try {
      r = run_job(*job);
    } catch (const std::exception& e) {
      r = contain_failure(what, &e);
    } catch (...) {
      r = contain_failure(what, nullptr);
    }
    std::vector<Subscriber> subs;
    {
      std::lock_guard lk(mu_);
      std::lock_guard sl(subs_mu_);
      // A caller that joined after the grant, or whose grant a failure undid, tries once more.
      if (r.ok && job->kind == Job::Kind::switch_model)
        for (auto& s : job->subs)
          if (s.wants_lease && !s.lease && state_ == SlotState::ready && model_ == job->target && !draining_)
            s.lease = make_lease_locked();
      subs = std::move(job->subs);
      current_.reset();
    }
    for (auto& s : subs) {
      if (!s.done) continue;
      try {
        if (!r.ok) s.lease.reset();
        s.done(r, std::move(s.lease));
      } catch (const std::exception& e) {
        log("a caller of the " + what + " failed on its result (ignored): " + utf8_excerpt(e.what()));
      }
    }
  }
  std::deque<std::shared_ptr<Job>> left;
  {
    std::lock_guard lk(mu_);
    left.swap(queue_);
  }
  OpResult r{false, "the daemon is shutting down", 0};
  for (auto& j : left)
    for (auto& s : j->subs)
      if (s.done) s.done(r, nullptr);
}

OpResult Supervisor::contain_failure(const std::string& what, const std::exception* e) {
  const std::string why = what + " failed: " + (e ? utf8_excerpt(e->what()) : std::string("unknown exception"));
  try {
    log("error: " + why);
    std::shared_ptr<EngineProcess> engine;
    std::string model;
    state::LaunchRecord rec;
    int stop_s = 30;
    {
      std::lock_guard lk(mu_);
      engine = engine_;
      model = model_;
      rec = record_;
      if (const auto* m = reg_.find_by_name(model_)) stop_s = m->stop_timeout_s;
    }
    // The failed operation may have left an engine running that the store does not know about:
    // it is stopped, so nothing runs that a restarted daemon could neither adopt nor reap.
    TerminateResult t;
    if (engine && engine->running())
      t = terminate(*engine, std::chrono::seconds(stop_s), std::chrono::milliseconds(opt_.kill_wait_ms));
    {
      std::lock_guard lk(mu_);
      if (engine_ == engine && t.clean()) engine_.reset();
      state_ = SlotState::failed;
      since_ms_ = state::now_ms();
      last_error_ = why;
      draining_ = false;
      switching_to_.clear();
      if (record_.id && record_.state != "failed" && record_.state != "stopped") {
        record_.state = "failed";
        record_.why = why;
        record_.stop_ms = state::now_ms();
        if (t.exit_status) record_.exit_status = t.exit_status;
        rec = record_;
      } else {
        rec = {};
      }
    }
    if (rec.id) {
      try {
        store_.update_launch(rec);
      } catch (const std::exception& again) {
        log("could not record launch " + std::to_string(rec.id) + " as failed: " + utf8_excerpt(again.what()));
      }
    }
    record_event("error", model, {{"operation", what}, {"why", why}});
  } catch (...) {
    // note: the containment itself must never throw (it runs in the switch thread's catch).
  }
  return {false, why, 0};
}

// --- the public entry points ---

OpResult Supervisor::switch_to(const std::string& model, const Progress& progress) {
  const registry::ModelEntry* m = resolve(model);
  if (!m) return switch_locked(model, progress);  // the "unknown model" answer, without queueing
  auto result = std::make_shared<std::promise<OpResult>>();
  auto future = result->get_future();
  auto job = std::make_shared<Job>();
  job->kind = Job::Kind::switch_model;
  job->target = m->name;
  job->subs.push_back({progress, [result](const OpResult& r, gateway::Lease) { result->set_value(r); }, false, {}});
  submit(job);
  return future.get();
}

OpResult Supervisor::switch_for_request(const std::string& model, const Progress& progress) {
  const registry::ModelEntry* m = resolve(model);
  if (!m) return switch_locked(model, progress);
  auto result = std::make_shared<std::promise<OpResult>>();
  auto future = result->get_future();
  auto job = std::make_shared<Job>();
  job->target = m->name;
  job->for_request = true;
  job->subs.push_back({progress, [result](const OpResult& r, gateway::Lease) { result->set_value(r); }, false, {}});
  submit(job);
  return future.get();
}

void Supervisor::submit_switch(const std::string& model, Progress progress, Done done) {
  const registry::ModelEntry* m = resolve(model);
  if (!m) {
    OpResult r = switch_locked(model, progress);
    if (done) done(r);
    return;
  }
  auto job = std::make_shared<Job>();
  job->target = m->name;
  job->subs.push_back({std::move(progress), [done](const OpResult& r, gateway::Lease) {
                         if (done) done(r);
                       }, false, {}});
  submit(job);
}

void Supervisor::submit_stop(const std::string& why, Progress progress, Done done) {
  auto job = std::make_shared<Job>();
  job->kind = Job::Kind::stop;
  job->why = why;
  job->subs.push_back({std::move(progress), [done](const OpResult& r, gateway::Lease) {
                         if (done) done(r);
                       }, false, {}});
  submit(job);
}

void Supervisor::ensure_running(const std::string& model, std::function<void(gateway::Lease, std::string)> done) {
  const registry::ModelEntry* m = resolve(model);
  if (!m) {
    if (done) done(nullptr, "unknown model '" + model + "'");
    return;
  }
  auto job = std::make_shared<Job>();
  job->target = m->name;
  job->for_request = true;
  job->subs.push_back({{}, [done, name = m->name](const OpResult& r, gateway::Lease lease) {
                         if (!done) return;
                         if (r.ok && !lease)
                           return done(nullptr, "model '" + name + "' was switched away before the lease");
                         done(r.ok ? std::move(lease) : nullptr, r.ok ? "" : r.error);
                       }, true, {}});
  submit(job);
}

}  // namespace servedeck::supervisor
