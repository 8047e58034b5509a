// What the gateway needs from the slot supervisor: where the running engine is, in-flight
// accounting (so a switch can drain), and asking for a model to be brought up.
// Implemented by gateway/supervisor/supervisor.{hpp,cpp}; tests may fake it.
//
// Thread-safety: every method may be called from any thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

namespace servedeck::gateway {

/// Slot states. See the diagram in gateway/supervisor/slot.hpp.
enum class SlotState { stopped, preflight, starting, ready, unhealthy, stopping, failed };

/// The state's name as status, /metrics and error messages print it ("unknown" for a value
/// outside the enum). Inline: the gateway library uses it without linking the supervisor's.
inline std::string_view to_string(SlotState s) {
  switch (s) {
    case SlotState::stopped: return "stopped";
    case SlotState::preflight: return "preflight";
    case SlotState::starting: return "starting";
    case SlotState::ready: return "ready";
    case SlotState::unhealthy: return "unhealthy";
    case SlotState::stopping: return "stopping";
    case SlotState::failed: return "failed";
  }
  return "unknown";
}

struct SlotSnapshot {
  SlotState state = SlotState::stopped;
  std::string model;          // registry key of the model starting/running/last run; "" when none
  std::string host;           // engine address when ready
  int port = 0;
  int64_t pid = 0;
  int64_t launch_id = 0;      // state-store launch id
  int64_t since_ms = 0;       // when the slot entered `state` (epoch ms)
  std::string last_error;     // failed start/stop reason with the log tail; why `unhealthy`
  std::string switching_to;   // target of a switch in progress, "" otherwise
  /// The ready model takes no new leases because a switch or stop is draining it (its in-flight
  /// requests finish; new ones are answered 503 model_draining).
  bool draining = false;
  int in_flight = 0;          // requests holding a lease
  /// The model (registry key) whose last switch preflight refused before stopping the ready
  /// model (the slot stayed ready on another), and why: one refused check per line,
  /// "check: message" with the reading and the limit (preflight::Report::refusals(), as `switch`
  /// printed them), or the error when the preflight could not run. Both "" when none; cleared
  /// when a model comes up ready and when a later switch to the same model passes those checks.
  std::string refused_model;
  std::string refusal;
};

/// Held by the gateway for the life of a proxied request. While any lease on the running model
/// exists, a switch waits (up to the model's drain_timeout_s) before stopping it.
using Lease = std::shared_ptr<void>;

class SlotControl {
 public:
  virtual ~SlotControl() = default;
  virtual SlotSnapshot snapshot() const = 0;
  /// A lease on `model` when it is the ready model; nullptr otherwise.
  virtual Lease acquire(const std::string& model) = 0;
  /// Asks for `model` to be running (switching if needed). Returns at once; `done(lease, error)`
  /// runs when the model is ready — with a lease taken at the moment it became ready, so no other
  /// switch can take the slot first — or with nullptr and why the attempt failed. It runs on the
  /// supervisor's switch thread, or on whichever thread refused the call outright (unknown model,
  /// shutting down, superseded by a later switch to another model); it must not block. Concurrent
  /// calls for the same model share one switch.
  virtual void ensure_running(const std::string& model, std::function<void(Lease lease, std::string error)> done) = 0;
  /// The proxy saw the ready engine of `model` (listening on `port`) miss a request's
  /// first-byte deadline; `why` says which. The slot may mark itself unhealthy. Returns at once.
  virtual void report_unresponsive(const std::string& model, int port, const std::string& why) {
    (void)model;
    (void)port;
    (void)why;
  }
};

}  // namespace servedeck::gateway
