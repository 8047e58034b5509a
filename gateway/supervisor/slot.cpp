#include "gateway/supervisor/slot.hpp"

namespace servedeck::supervisor {

bool allowed_transition(SlotState from, SlotState to) {
  using S = SlotState;
  switch (from) {
    case S::stopped: return to == S::preflight || to == S::starting;  // starting: adoption at daemon start
    case S::preflight: return to == S::starting || to == S::failed;
    case S::starting: return to == S::ready || to == S::failed || to == S::stopping;
    case S::ready: return to == S::stopping || to == S::failed || to == S::unhealthy;
    case S::unhealthy: return to == S::ready || to == S::stopping || to == S::failed;
    case S::stopping: return to == S::stopped || to == S::failed;
    case S::failed: return to == S::stopping;
  }
  return false;
}

}  // namespace servedeck::supervisor
