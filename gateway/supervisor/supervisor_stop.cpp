// Supervisor operations, stopping: stop() and stop_engine (drain in-flight requests, terminate
// the process group, SIGKILL past stop_timeout_s, wait for the GPU to release its memory), the
// launch blocker left by processes that survived SIGKILL, and the /dev/shm reap.
#include "gateway/supervisor/supervisor.hpp"

#include <algorithm>
#include <chrono>

#include "gateway/supervisor/supervisor_internal.hpp"
#include "registry/registry.hpp"

namespace servedeck::supervisor {

using detail::Clock;
using detail::fmt_s;
using detail::say;
using detail::seconds_since;

std::string Supervisor::stop_engine(const std::string& why, bool drain, const Progress& progress) {
  std::shared_ptr<EngineProcess> engine;
  std::shared_ptr<LaunchLog> log;
  std::shared_ptr<LeaseCounter> leases;
  SlotState state;
  std::string model;
  {
    std::lock_guard lk(mu_);
    engine = engine_;
    log = log_;
    leases = leases_;
    state = state_;
    model = model_;
    if (state_ == SlotState::ready || state_ == SlotState::unhealthy) draining_ = true;
  }
  const registry::ModelEntry* m = reg_.find_by_name(model);
  int drain_s = m ? m->drain_timeout_s : 30;
  int stop_s = m ? m->stop_timeout_s : 30;
  int vram_s = m ? m->vram_release_timeout_s : 60;
  if (drain && (state == SlotState::ready || state == SlotState::unhealthy)) {
    // Progress lines are written with no lock held (a listener may take the queue's lock).
    int in_flight = 0;
    {
      std::lock_guard lk(leases->mu);
      in_flight = leases->count;
    }
    if (in_flight > 0) {
      say(progress, "draining " + std::to_string(in_flight) + " in-flight request(s) on " + model + ", up to " +
                        std::to_string(drain_s) + " s");
      bool drained = false;
      {
        std::unique_lock lk(leases->mu);
        drained = leases->cv.wait_for(lk, std::chrono::seconds(drain_s), [&] { return leases->count == 0; });
        in_flight = leases->count;
      }
      if (!drained)
        say(progress, "drain timeout: " + std::to_string(in_flight) + " request(s) still in flight; stopping anyway");
      else
        say(progress, "drained");
    }
  }
  set_state(SlotState::stopping);
  // Only a live engine's log hears about its stop: a slot that is failed or stopped still holds
  // the last launch's log, whose engine exited long ago.
  if (log && engine && engine->running()) log->note("stopping: " + why);
  TerminateResult t;
  if (engine) {
    say(progress, "stopping " + model + " (pid " + std::to_string(engine->pid()) + ")");
    // The log stays bounded while the engine dies (it may still write), and once more after.
    t = terminate(*engine, std::chrono::seconds(std::max(0, stop_s)), std::chrono::milliseconds(opt_.kill_wait_ms),
                  progress, [&log] {
                    if (log) log->enforce_bound();
                  });
    if (log) log->enforce_bound();
  }
  std::string failure;
  if (!t.clean()) {
    failure = "engine " + model + " survived SIGKILL: " + t.describe_survivors() +
              "; the next launch is blocked until these processes exit";
    std::lock_guard lk(mu_);
    blocker_ = failure;
    blocker_pids_.clear();
    for (const auto& s : t.survivors) blocker_pids_.push_back(s.stat.pid);
  } else if (gpu_ && !t.pids_seen.empty()) {
    auto used = gpu_->used_mib(t.pids_seen);
    if (used && *used > 0) {
      say(progress, "waiting for the GPU to release " + fmt_s(*used) + " MiB (up to " + std::to_string(vram_s) + " s)");
      auto deadline = Clock::now() + std::chrono::seconds(vram_s);
      while (used && *used > 0 && Clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(opt_.poll_ms));
        used = gpu_->used_mib(t.pids_seen);
      }
      if (used && *used > 0) {
        failure = "GPU memory not released " + std::to_string(vram_s) + " s after " + model + " exited: " +
                  fmt_s(*used) + " MiB still held";
        std::lock_guard lk(mu_);
        blocker_ = failure;
        blocker_pids_ = t.pids_seen;
      } else {
        say(progress, "GPU memory released");
      }
    }
  }
  state::LaunchRecord rec;
  {
    std::lock_guard lk(mu_);
    if (engine && !engine->exit_description().empty()) last_exit_ = engine->exit_description();
    // A launch already recorded as failed/stopped keeps its state and why.
    if (record_.id && record_.state != "failed" && record_.state != "stopped") {
      record_.stop_ms = state::now_ms();
      if (t.exit_status) record_.exit_status = t.exit_status;
      record_.state = failure.empty() ? "stopped" : "failed";
      record_.why = failure.empty() ? why : failure;
      rec = record_;
    }
    if (failure.empty()) engine_.reset();
  }
  if (rec.id) store_.update_launch(rec);
  record_event("stop", model, {{"why", why}, {"sigkill", t.sigkill_sent}, {"failure", failure}});
  if (!failure.empty()) {
    set_state(SlotState::failed, failure);
    say(progress, "stop failed: " + failure);
    return failure;
  }
  set_state(SlotState::stopped);
  std::string ended = engine ? engine->exit_description() : "";
  say(progress, "stopped " + model + (ended.empty() ? "" : " (" + ended + ")"));
  return "";
}

std::string Supervisor::check_blocker() {
  std::lock_guard lk(mu_);
  if (blocker_.empty()) return "";
  bool still = false;
  for (int64_t pid : blocker_pids_) {
    auto st = read_proc_stat(pid);
    if (st && st->state != 'Z' && st->state != 'X') still = true;
  }
  if (gpu_ && !blocker_pids_.empty()) {
    auto used = gpu_->used_mib(blocker_pids_);
    if (used && *used > 0) still = true;
  }
  if (still) return blocker_;
  blocker_.clear();
  blocker_pids_.clear();
  engine_.reset();
  return "";
}

ReapReport Supervisor::reap(const std::vector<std::string>& models, const Progress& progress) {
  // Only the slot's own models' globs: another model's buffers are not this slot's to free.
  std::vector<std::string> globs;
  std::vector<std::string> seen;
  for (const auto& name : models) {
    const registry::ModelEntry* e = reg_.find_by_name(name);
    if (!e || std::find(seen.begin(), seen.end(), name) != seen.end()) continue;
    seen.push_back(name);
    globs.insert(globs.end(), e->shm_globs.begin(), e->shm_globs.end());
  }
  if (globs.empty()) return {};
  ReapReport r = reap_shm(globs, opt_.shm_dir, "/proc", reg_.server.shm_keep_unverifiable);
  for (const auto& g : r.ignored_globs) say(progress, "shm: glob " + g + " ignored");
  if (!r.freed.empty() || !r.kept.empty() || !r.errors.empty()) {
    say(progress, "shm: " + r.summary());
    nlohmann::json freed = nlohmann::json::array();
    for (const auto& f : r.freed) freed.push_back({{"path", f.path}, {"bytes", f.bytes}});
    nlohmann::json kept = nlohmann::json::array();
    for (const auto& k : r.kept) kept.push_back({{"path", k.path}, {"bytes", k.bytes}, {"why", k.why}});
    record_event("reap", "", {{"freed_bytes", r.freed_bytes()}, {"freed", freed}, {"kept", kept}});
  }
  return r;
}

OpResult Supervisor::stop(const std::string& why, const Progress& progress) {
  abort_start_ = true;
  std::lock_guard op(op_mu_);
  abort_start_ = false;
  return stop_locked(why, progress);
}

OpResult Supervisor::stop_locked(const std::string& why, const Progress& progress) {
  auto t0 = Clock::now();
  std::string err;
  bool have_engine;
  std::string model;
  {
    std::lock_guard lk(mu_);
    have_engine = engine_ != nullptr || (state_ != SlotState::stopped && state_ != SlotState::failed);
    model = model_;
  }
  if (have_engine) err = stop_engine(why, true, progress);
  else say(progress, "no engine running");
  reap({model}, progress);
  if (err.empty()) {
    std::lock_guard lk(mu_);
    if (state_ == SlotState::failed) {  // a failed slot with nothing left becomes stopped
      state_ = SlotState::stopped;
      since_ms_ = state::now_ms();
    }
  }
  return {err.empty(), err, seconds_since(t0)};
}

}  // namespace servedeck::supervisor
