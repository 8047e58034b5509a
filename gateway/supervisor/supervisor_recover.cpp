// Daemon-start recovery: adopt the engine a previous daemon left when it is still the very launch
// models.toml describes, stop it otherwise, and kill what is verifiably left of dead launches.
#include <chrono>

#include "common/json_limits.hpp"
#include "gateway/supervisor/engine_identity.hpp"
#include "gateway/supervisor/supervisor.hpp"
#include "gateway/supervisor/supervisor_internal.hpp"
#include "registry/registry.hpp"

namespace servedeck::supervisor {

namespace {

/// 16 hex digits of FNV-1a(64) over the serialised argv and env of a launch.
std::string launch_hash(const nlohmann::json& argv, const nlohmann::json& env) {
  uint64_t h = 14695981039346656037ull;
  for (unsigned char c : dump_safe(argv) + "\n" + dump_safe(env)) {
    h ^= c;
    h *= 1099511628211ull;
  }
  char buf[24];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

std::string quoted(const nlohmann::json& v) { return v.is_null() ? "(absent)" : dump_safe(v); }

}  // namespace

std::shared_ptr<EngineCgroup> Supervisor::open_cgroup(const std::string& tag) const {
  if (cgroup_parent_.empty()) return nullptr;
  return EngineCgroup::open(cgroup_parent_, launch_cgroup_name(tag));
}

std::string Supervisor::launch_mismatch(const registry::ModelEntry& m, const state::LaunchRecord& rec) const {
  registry::LaunchSpec spec;
  try {
    spec = registry::render_launch(m, rec.port, reg_.server);
  } catch (const std::exception& e) {
    return "models.toml no longer renders a launch of " + m.name + ": " + e.what();
  }
  const nlohmann::json argv = spec.argv;
  const nlohmann::json env = spec.env;
  if (argv == rec.argv && env == rec.env) return "";
  std::string first;
  if (argv != rec.argv) {
    const std::size_t n = std::max(argv.size(), rec.argv.size());
    for (std::size_t i = 0; i < n && first.empty(); ++i) {
      nlohmann::json a = i < rec.argv.size() ? rec.argv[i] : nlohmann::json();
      nlohmann::json b = i < argv.size() ? argv[i] : nlohmann::json();
      if (a != b) first = "argv[" + std::to_string(i) + "] was " + quoted(a) + ", models.toml now renders " + quoted(b);
    }
  } else {
    for (auto it = env.begin(); it != env.end() && first.empty(); ++it)
      if (!rec.env.contains(it.key()) || rec.env[it.key()] != it.value())
        first = "env " + it.key() + " was " +
                quoted(rec.env.contains(it.key()) ? rec.env[it.key()] : nlohmann::json()) +
                ", models.toml now renders " + quoted(it.value());
    for (auto it = rec.env.begin(); it != rec.env.end() && first.empty(); ++it)
      if (!env.contains(it.key()))
        first = "env " + it.key() + " was " + quoted(it.value()) + ", models.toml no longer sets it";
  }
  return "models.toml changed since launch " + std::to_string(rec.id) + " of " + m.name + " (argv+env hash " +
         launch_hash(rec.argv, rec.env) + " recorded, " + launch_hash(argv, env) + " rendered now): " + first;
}

void Supervisor::recover(const Progress& progress) {
  std::lock_guard op(op_mu_);
  std::vector<state::LaunchRecord> launches;
  try {
    launches = store_.unfinished_launches();
  } catch (const std::exception& e) {
    const std::string why = "recovery could not read the state store: " + utf8_excerpt(e.what());
    log(why);
    detail::say(progress, why);
    return;
  }
  bool adopted = false;
  std::vector<std::string> reap_models;
  for (auto it = launches.rbegin(); it != launches.rend(); ++it) {
    try {
      recover_launch(*it, adopted, reap_models, progress);
    } catch (const std::exception& e) {
      // One launch that cannot be recovered (a store error, a file system error) is reported and
      // the others are still handled; the daemon serves either way. A launch that had become the
      // slot's (an adoption under way) is failed and its engine stopped, like any operation.
      const std::string what = "recovery of launch " + std::to_string(it->id) + " (" + it->model + ")";
      bool slots_own = false;
      {
        std::lock_guard lk(mu_);
        slots_own = record_.id == it->id;
      }
      if (slots_own) {
        detail::say(progress, contain_failure(what, &e).error);
      } else {
        const std::string why = what + " failed: " + utf8_excerpt(e.what());
        log(why);
        detail::say(progress, why);
        record_event("error", it->model, {{"launch", it->id}, {"why", why}});
      }
    }
  }
  try {
    reap(reap_models, progress);
  } catch (const std::exception& e) {
    log("recovery: the /dev/shm reap failed: " + utf8_excerpt(e.what()));
  }
}

void Supervisor::recover_launch(const state::LaunchRecord& recorded, bool& adopted,
                                std::vector<std::string>& reap_models, const Progress& progress) {
  auto say = [&](const std::string& s) { detail::say(progress, s); };
  state::LaunchRecord rec = recorded;
  const registry::ModelEntry* m = reg_.find_by_name(rec.model);
  const std::string tag = launch_tag(opt_.state_dir, rec.id);
  auto cgroup = open_cgroup(tag);
  auto engine =
      rec.pid > 0 ? EngineProcess::adopt(rec.pid, static_cast<uint64_t>(rec.pid_start_time), tag, cgroup) : nullptr;
  const std::string mismatch = engine && m ? launch_mismatch(*m, rec) : "";
  if (engine && m && !adopted && mismatch.empty()) {
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
      {
        std::lock_guard lk(mu_);
        state_ = SlotState::ready;
        since_ms_ = ready_ms_ = last_health_ms_ = last_probe_ms_ = state::now_ms();
        std::lock_guard ll(leases_->mu);
        leases_->last_active_ms = since_ms_;
      }
      record_event("adopt", rec.model, {{"launch", rec.id}, {"pid", rec.pid}});
      say("adopted " + rec.model + ": ready");
    } else {
      fail_start(*m, "adopted engine not ready: " + why, progress);
    }
    return;
  }
  // Not adoptable: stop it (a live engine of another launch or configuration), or kill what is
  // verifiably left of it (its cgroup, its marker); mark it ended with the reason.
  std::string why;
  const int stop_s = m ? m->stop_timeout_s : 10;
  if (engine) {
    why = !m ? "model '" + rec.model + "' is no longer in the registry"
             : !mismatch.empty() ? mismatch : "a newer launch was adopted";
    say("stopping launch " + std::to_string(rec.id) + " of " + rec.model + " (pid " + std::to_string(rec.pid) +
        "): " + why);
    auto t = terminate(*engine, std::chrono::seconds(stop_s), std::chrono::milliseconds(opt_.kill_wait_ms), progress);
    rec.exit_status = t.exit_status;
  } else {
    EngineIdentity id;
    id.leader = rec.pid;
    id.leader_start_time = static_cast<uint64_t>(rec.pid_start_time);
    id.tag = tag;
    id.cgroup = cgroup;
    auto t = terminate_orphans(id, std::chrono::seconds(stop_s), std::chrono::milliseconds(opt_.kill_wait_ms));
    auto st = read_proc_stat(rec.pid);
    why = "engine pid " + std::to_string(rec.pid) + " gone at daemon start" +
          (st && st->start_time != static_cast<uint64_t>(rec.pid_start_time) ? " (pid now reused)" : "");
    if (!t.pids_seen.empty())
      why += "; killed " + std::to_string(t.pids_seen.size()) + " leftover process(es) of its launch";
  }
  rec.state = "stopped";
  rec.why = why;
  if (!rec.stop_ms) rec.stop_ms = state::now_ms();
  store_.update_launch(rec);
  record_event("reap", rec.model, {{"launch", rec.id}, {"why", why}});
  say("reaped launch " + std::to_string(rec.id) + " of " + rec.model + ": " + why);
  reap_models.push_back(rec.model);
}

}  // namespace servedeck::supervisor
