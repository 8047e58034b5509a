// The slot supervisor: starts, watches and stops the engine of the main slot, and implements
// gateway::SlotControl for the gateway. State machine: gateway/supervisor/slot.hpp.
//
// Operations (switch_to, stop, recover) are serialised: one runs at a time; the others wait.
// snapshot(), acquire(), status_json() never wait for an operation.
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

struct SupervisorOptions {
  std::string state_dir;                 // launch logs in <state_dir>/logs
  std::string shm_dir = "/dev/shm";      // reaped directory (tests: a temp dir)
  int poll_ms = 100;                     // health polling and liveness interval, ms
  int health_probe_timeout_ms = 2000;    // one health GET, ms
  int kill_wait_ms = 5000;               // after SIGKILL, how long to wait before reporting survivors, ms
  int log_tail_lines = 30;               // lines of the engine log quoted in a failure
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
  void ensure_running(const std::string& model, std::function<void(bool ok, std::string error)> done) override;

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
  /// previous model.
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
  /// start time still match (then health + warm-up → ready), otherwise kill what is left of its
  /// group/session and mark it stopped; then reap /dev/shm.
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
  };

  const registry::ModelEntry* resolve(const std::string& model) const;
  void set_state(SlotState s, const std::string& error = "");
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
  /// Drain (when ready), then SIGTERM → SIGKILL → survivors check → VRAM wait. "" or why not.
  std::string stop_engine(const std::string& why, bool drain, const Progress& progress);
  std::string check_blocker();
  ReapReport reap(const Progress& progress);
  void record_measured_memory(const registry::ModelEntry& m, double load_s);
  void monitor_loop();
  void switch_loop();

  const registry::Registry& reg_;
  state::Store& store_;
  preflight::Readings& readings_;
  std::unique_ptr<GpuMemoryProbe> gpu_;
  SupervisorOptions opt_;

  std::mutex op_mu_;  // serialises switch_to / stop / recover

  mutable std::mutex mu_;  // guards everything below
  SlotState state_ = SlotState::stopped;
  std::string model_;
  std::string host_;
  int port_ = 0;
  int64_t since_ms_ = 0;
  int64_t ready_ms_ = 0;
  std::string last_error_;
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

  // ensure_running queue
  std::map<std::string, std::vector<std::function<void(bool, std::string)>>> waiting_;
  std::deque<std::string> queue_;
  std::condition_variable queue_cv_;

  std::atomic<bool> abort_start_{false};  // set by stop(): a start in progress gives up
  bool shutting_down_ = false;
  std::condition_variable shutdown_cv_;
  std::thread monitor_;
  std::thread switcher_;
};

}  // namespace servedeck::supervisor
