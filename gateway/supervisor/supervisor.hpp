// The slot supervisor: starts, watches and stops the engine of the main slot, and implements
// gateway::SlotControl for the gateway. State machine: gateway/supervisor/slot.hpp.
//
// Operations (switch, stop, recover) are serialised: one runs at a time; the others wait.
// Switches run on the supervisor's own switch thread, from a coalescing queue (never on the
// gateway's shared blocking pool, so a status call never waits behind a model load):
//   - a switch to the target of the switch running or queued joins it (one load, every caller
//     gets its progress lines and its result);
//   - a switch to another target, or a stop, supersedes the queued ones: their callers are told
//     "superseded by ..." at once; the running one finishes first (a stop also aborts its start);
//   - a caller that wants a lease (ensure_running) gets it in the same critical section in which
//     the slot becomes ready, so no other operation can take the slot in between.
// snapshot(), acquire(), status_json() never wait for an operation.
//
// Failures stay inside their operation: an exception anywhere in a switch, stop, recovery, the
// monitor or the liveness probes (a SQLite error, a full disk) is caught on that thread, written
// to the daemon log (SupervisorOptions::log), recorded as an "error" event when the store takes
// it and as the slot's last_error, and fails that operation only: the slot becomes `failed`, an
// engine the failed operation started is stopped, and the next operation starts over.
//
// Liveness after ready (docs/supervisor.md): the health path is probed every liveness_interval_s
// (deadline liveness_timeout_s), a one-token completion is sent when the slot has been idle for
// liveness_idle_s, and the proxy reports a request that got no first byte within
// first_byte_timeout_ms (report_unresponsive). Any failure makes the slot `unhealthy` with the
// reason (no new leases); a later pair of passing probes makes it `ready` again, and with
// restart_on_failure the engine is restarted at once (at most k_max_auto_restarts per
// k_auto_restart_window_s per model).
//
// What "ready" means: the health path answered 200 AND a one-token warm-up completion succeeded
// before the start deadline (G26). The deadline is start_timeout_s, extended while the engine's
// log keeps growing (load progress, G30) — the engine may be silent for at most start_timeout_s
// at a time — and never beyond k_max_start_extension × start_timeout_s in total.
// What "stopped" means: no process of the engine's group or session is alive, and the GPU memory
// those processes held is released (when a GPU probe exists). A process stuck in state D after
// SIGKILL, or GPU memory never released, leaves the slot `failed` and blocks the next launch
// with that message until the condition clears.
//
// Thread-safety: every public method may be called from any thread.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "gateway/state/store.hpp"
#include "gateway/supervisor/engine_cgroup.hpp"
#include "gateway/supervisor/launch_log.hpp"
#include "gateway/supervisor/probes.hpp"
#include "gateway/supervisor/process_group.hpp"
#include "gateway/supervisor/shm_reaper.hpp"
#include "gateway/supervisor/slot.hpp"
#include "gateway/supervisor/slot_control.hpp"
#include "preflight/preflight.hpp"
#include "registry/model_entry.hpp"

namespace servedeck::supervisor {

/// One human-readable progress line ("preflight: host_ram pass ...", "ready in 12.3 s").
using Progress = std::function<void(const std::string& line)>;

/// note: a hard cap on the G30 extension so an engine that prints errors in a loop without ever
/// becoming healthy still fails; 10 × start_timeout_s (600 s default → 100 min) is far above the
/// slowest load measured (GLM-5.3 with expert offload, ~9 min).
constexpr int k_max_start_extension = 10;

/// note: restart_on_failure restarts a model at most this many times in k_auto_restart_window_s
/// (systemd's StartLimitBurst/StartLimitIntervalSec idea): an engine that dies at every load
/// stays failed instead of reloading a 100 GiB checkpoint for ever.
constexpr int k_max_auto_restarts = 3;
constexpr int k_auto_restart_window_s = 600;

struct SupervisorOptions {
  std::string state_dir;                 // launch logs in <state_dir>/logs
  std::string shm_dir = "/dev/shm";      // reaped directory (tests: a temp dir)
  int poll_ms = 100;                     // health polling and liveness interval, ms
  int health_probe_timeout_ms = 2000;    // one health GET, ms
  int kill_wait_ms = 5000;               // after SIGKILL, how long to wait before reporting survivors, ms
  int log_tail_lines = 30;               // lines of the engine log quoted in a failure
  /// Where launch cgroups are created. nullopt: EngineCgroup::default_parent() (none when the
  /// daemon's cgroup is not writable, see engine_cgroup.hpp); "": never (launches are found
  /// through their session and marker only).
  std::optional<std::string> cgroup_parent;
  /// The daemon's log (one line per call; `servedeck serve` prefixes the time). Default: stderr.
  std::function<void(const std::string&)> log;
  /// Overrides the preflight (tests). Default: preflight::run_preflight(reg, m, readings, port).
  std::function<preflight::Report(const registry::ModelEntry&, int port)> preflight;
};

/// The outcome of an operation.
struct OpResult {
  bool ok = false;
  std::string error;      // why it failed (with the log tail for a failed start)
  double seconds = 0;     // how long it took
  /// A switch refused by a declaration check (preflight::Stage::declaration) before the running
  /// engine was stopped: the slot is exactly as it was (still ready and serving).
  bool refused_before_stop = false;
};

class Supervisor : public gateway::SlotControl {
 public:
  /// `reg`, `store` and `readings` must outlive the Supervisor. `gpu` may be null (no GPU).
  Supervisor(const registry::Registry& reg, state::Store& store, preflight::Readings& readings,
             std::unique_ptr<GpuMemoryProbe> gpu, SupervisorOptions opt);
  /// Stops the monitor and switch threads. Does not stop the engine: call stop() first when the
  /// engine must not outlive the daemon (the next daemon adopts it otherwise).
  ~Supervisor() override;
  Supervisor(const Supervisor&) = delete;
  Supervisor& operator=(const Supervisor&) = delete;

  // SlotControl
  gateway::SlotSnapshot snapshot() const override;
  gateway::Lease acquire(const std::string& model) override;
  /// Queues a request-triggered switch (switch_for_request's residency wait applies); `done` gets
  /// a lease taken when the slot became ready, or nullptr and why.
  void ensure_running(const std::string& model, std::function<void(gateway::Lease, std::string)> done) override;
  /// The proxy got no first byte from the ready engine of `model` on `port` in time: the slot
  /// becomes unhealthy (a report about an engine that is no longer the slot's is ignored).
  void report_unresponsive(const std::string& model, int port, const std::string& why) override;

  /// What a queued operation's caller hears at the end (on the switch thread).
  using Done = std::function<void(const OpResult&)>;
  /// Queues a switch like switch_to() and returns at once; `progress` gets the switch's lines as
  /// they happen from the moment this call queued or joined it, `done` the result (on the
  /// switch thread; on the calling thread when refused at once: unknown model, shutting down).
  void submit_switch(const std::string& model, Progress progress, Done done);
  /// Queues a stop like stop() (superseding queued switches, aborting a start in progress).
  void submit_stop(const std::string& why, Progress progress, Done done);

  /// Brings `model` (registry key, served name or alias) up. When a model is ready: first the
  /// declaration checks of the preflight (those whose verdict stopping it cannot change: program,
  /// checkpoint, GPU present, ctx, KV cap, offload consistency, [[rules]]); a refusal there ends
  /// the switch with the table, leaves the running model ready and serving, records the refusal
  /// (a "preflight" event with before_stop, last_error, and the snapshot's refused_model/refusal
  /// the gateway's 409 for that model quotes) and sets OpResult::refused_before_stop.
  /// Then: drain in-flight leases (up to the running model's drain_timeout_s), stop, reap
  /// /dev/shm, the full preflight (a refusal ends the switch with the table, slot `failed`),
  /// start, wait for ready. Blocking; `progress` gets each step as it happens. On a failed start
  /// (not a refusal before the stop) with server.restore_previous_on_failed_start, starts the
  /// previous model. Runs on the switch queue (above); blocks until the result.
  OpResult switch_to(const std::string& model, const Progress& progress = {});

  /// A switch asked for by a client request (ensure_running) rather than by the operator: it
  /// first waits until the running model has been ready for its min_residency_s (G28: a model
  /// that just came up is not evicted at once by a request for another), then switches. The
  /// wait is bounded by min_residency_s; leases still in flight are then drained as usual.
  OpResult switch_for_request(const std::string& model, const Progress& progress = {});

  /// Drains, stops the engine (if any) and reaps /dev/shm. Blocking. A start in progress is
  /// abandoned at its next poll ("start aborted by stop") rather than waited for.
  OpResult stop(const std::string& why, const Progress& progress = {});

  /// At daemon start: for each launch the store records as unfinished, adopt it when its pid and
  /// start time still match AND the recorded launch (argv and env) equals what models.toml renders
  /// for it now (then health + warm-up → ready); otherwise stop it (the reason names the first
  /// difference and both argv+env hashes) or kill what is verifiably left of it, and mark it
  /// stopped; then reap the /dev/shm globs of those models. A failure with one launch is logged
  /// and recorded and does not stop the others.
  void recover(const Progress& progress = {});

  /// Status for the admin API and the CLI: the snapshot plus uptime, ctx, host RSS of the group
  /// (GiB, from /proc), VRAM of the group (GiB, from the GPU probe; null without a GPU), log path,
  /// launch blocker, last measured memory, and the last switch preflight refused before the stop
  /// ("refused_model", "refusal": one "check: message" per line; both null when none recorded).
  nlohmann::json status_json() const;

  /// The log file of the current launch, or of the newest launch of `model` when given. With no
  /// current launch: the newest launch of the slot's model ("" when it never launched, e.g. after
  /// a preflight refusal), or of any model when the slot has none yet.
  std::string log_path(const std::string& model = "") const;

  /// Makes a start in progress give up at its next poll ("the daemon is shutting down"; its
  /// engine is stopped like any failed start) and stops accepting ensure_running calls. stop()
  /// still works afterwards. Idempotent; the destructor calls it.
  void begin_shutdown();

  const registry::Registry& registry() const { return reg_; }

 private:
  struct LeaseCounter {
    std::mutex mu;
    std::condition_variable cv;
    int count = 0;
    int64_t last_active_ms = 0;  // epoch ms of the last acquire or release (liveness idle time)
  };
  /// One caller of a queued operation.
  struct Subscriber {
    Progress progress;
    std::function<void(const OpResult&, gateway::Lease)> done;
    bool wants_lease = false;
    gateway::Lease lease;  // granted when the target became ready
  };
  /// A queued or running operation.
  struct Job {
    enum class Kind { switch_model, stop } kind = Kind::switch_model;
    std::string target;        // registry key (switch)
    std::string why;           // stop reason
    bool for_request = false;  // G28 residency applies (only request-triggered callers joined)
    bool ready_granted = false;
    std::vector<Subscriber> subs;
  };

  const registry::ModelEntry* resolve(const std::string& model) const;
  void set_state(SlotState s, const std::string& error = "");
  void log(const std::string& line) const;
  /// add_event that never throws (a failure is logged): for records a failed write must not undo.
  void record_event(std::string_view kind, const std::string& model, const nlohmann::json& detail);

  // queue (supervisor_queue.cpp)
  void submit(std::shared_ptr<Job> job);
  void switch_loop();
  OpResult run_job(Job& job);
  /// Passes `line` to every subscriber of `job` (takes only subs_mu_: callable with mu_ held).
  void job_progress(const Job& job, const std::string& line);
  /// Under mu_: a lease for every subscriber of the running switch to `model` that wants one.
  void grant_leases_locked(const std::string& model);
  gateway::Lease make_lease_locked();
  /// An exception ended `what`: log, record, mark the slot failed, stop the engine the operation
  /// may have left running. Never throws.
  OpResult contain_failure(const std::string& what, const std::exception* e);

  // switch (supervisor.cpp)
  OpResult switch_locked(const std::string& model, const Progress& progress);
  OpResult do_switch(const registry::ModelEntry& m, const Progress& progress);
  /// The declaration checks for `m` while `running` is ready; nullopt when none refuses, else the
  /// refusal (recorded; the slot untouched).
  std::optional<OpResult> preflight_before_stop(const registry::ModelEntry& m, const std::string& running, int port,
                                                const Progress& progress);
  OpResult launch(const registry::ModelEntry& m, const Progress& progress);
  /// Waits for ready; "" on success, else why.
  std::string wait_ready(const registry::ModelEntry& m, EngineProcess& engine, LaunchLog& log, int port,
                         const Progress& progress);
  OpResult fail_start(const registry::ModelEntry& m, const std::string& why, const Progress& progress);
  void record_measured_memory(const registry::ModelEntry& m, double load_s);

  // stop (supervisor_stop.cpp)
  OpResult stop_locked(const std::string& why, const Progress& progress);
  /// Drain (when ready), then SIGTERM → SIGKILL → survivors check → VRAM wait. "" or why not.
  std::string stop_engine(const std::string& why, bool drain, const Progress& progress);
  std::string check_blocker();
  /// Reaps /dev/shm against the globs of `models` (registry keys; unknown ones are skipped).
  ReapReport reap(const std::vector<std::string>& models, const Progress& progress);

  // watch (supervisor_watch.cpp) and liveness (supervisor_liveness.cpp)
  void monitor_loop();
  void monitor_tick();
  void liveness_loop();
  void liveness_tick();
  /// What becoming unhealthy still has to report once mu_ is released.
  struct Unhealthy {
    std::string model;
    int64_t launch_id = 0;
    std::string why;
    std::shared_ptr<LaunchLog> log;
    std::shared_ptr<Job> restart;  // restart_on_failure: to submit()
  };
  /// Under mu_: ready → unhealthy with `why` (state, last_error, the restart job when configured).
  Unhealthy mark_unhealthy_locked(const std::string& why);
  /// After mu_: the log line, the launch log note, the "unhealthy" event, the restart.
  void publish_unhealthy(const Unhealthy& u);
  /// Under mu_: with restart_on_failure on `model`, a switch job that restarts it, unless an
  /// operation is queued or running (it replaces the engine anyway) or k_max_auto_restarts were
  /// made in the last k_auto_restart_window_s (then `why_not` says so). nullptr otherwise.
  std::shared_ptr<Job> maybe_restart_locked(const std::string& model, std::string* why_not);

  // recovery (supervisor_recover.cpp)
  void recover_launch(const state::LaunchRecord& rec, bool& adopted, std::vector<std::string>& reap_models,
                      const Progress& progress);
  /// "" when the recorded launch equals what the registry renders for `m` now, else the first
  /// difference with both argv+env hashes.
  std::string launch_mismatch(const registry::ModelEntry& m, const state::LaunchRecord& rec) const;
  /// The launch cgroup for a launch tag, when launch cgroups are available.
  std::shared_ptr<EngineCgroup> open_cgroup(const std::string& tag) const;

  const registry::Registry& reg_;
  state::Store& store_;
  preflight::Readings& readings_;
  std::unique_ptr<GpuMemoryProbe> gpu_;
  SupervisorOptions opt_;
  std::string cgroup_parent_;        // "" = no launch cgroups
  std::string cgroup_unavailable_;   // why there are none (logged once, shown by status)

  std::mutex op_mu_;  // serialises switch / stop / recover

  mutable std::mutex mu_;  // guards everything below
  SlotState state_ = SlotState::stopped;
  std::string model_;
  std::string host_;
  int port_ = 0;
  int64_t since_ms_ = 0;
  int64_t ready_ms_ = 0;
  std::string last_error_;
  std::string last_exit_;            // describe_wait_status of the last engine exit, "" when unknown
  std::string refused_model_;        // SlotSnapshot::refused_model / refusal
  std::string refusal_;
  std::string switching_to_;
  std::string blocker_;              // D-state / VRAM message that blocks the next launch
  std::vector<int64_t> blocker_pids_;
  bool draining_ = false;
  std::shared_ptr<EngineProcess> engine_;
  std::shared_ptr<LaunchLog> log_;
  state::LaunchRecord record_;       // the current launch (id 0 when none)
  std::shared_ptr<LeaseCounter> leases_ = std::make_shared<LeaseCounter>();
  // liveness: per current launch
  int64_t last_health_ms_ = 0;       // last health probe (epoch ms)
  int64_t last_probe_ms_ = 0;        // last one-token completion probe (epoch ms)
  std::vector<Unhealthy> unpublished_;  // report_unresponsive's, published by the liveness thread
  std::map<std::string, std::vector<int64_t>> auto_restarts_;  // model → epoch ms of automatic restarts

  // the switch queue
  mutable std::mutex subs_mu_;       // guards every Job::subs; taken after mu_, never before it
  std::deque<std::shared_ptr<Job>> queue_;
  std::shared_ptr<Job> current_;
  std::condition_variable queue_cv_;

  std::atomic<bool> abort_start_{false};  // set by a stop: the running switch gives up (cleared when the next job begins)
  bool shutting_down_ = false;
  std::condition_variable shutdown_cv_;
  std::thread monitor_;
  std::thread liveness_;
  std::thread switcher_;
};

}  // namespace servedeck::supervisor
