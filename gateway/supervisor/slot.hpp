// The slot state machine. One slot per GPU (today: the "main slot"), running at most one engine.
//
//                 switch(M)                 preflight passed
//    ┌────────┐ ───────────▶ ┌───────────┐ ─────────────────▶ ┌──────────┐
//    │stopped │              │ preflight │                    │ starting │
//    └────────┘ ◀──┐         └───────────┘                    └──────────┘
//        ▲         │               │ refused                    │      │ health 200 AND
//        │         │               ▼                            │      │ one-token warm-up ok
//        │         │          ┌────────┐ ◀──────────────────────┘      ▼ before the deadline
//        │         │          │ failed │  exited / deadline /      ┌───────┐  probe failed /   ┌───────────┐
//        │         │          └────────┘  warm-up failed (G26)     │ ready │ ────────────────▶ │ unhealthy │
//        │         │            ▲    │                             └───────┘  first byte late  └───────────┘
//        │         │  engine    │    │ switch / stop: full reap       │   ▲ ◀───────────────────  │   │
//        │         │  exited    └────┼────────────────────────────────┘   │  health + completion  │   │
//        │         │  (liveness)     │  ◀──────────────────────────────── │ ─ probes pass again ──┘   │
//        │         │                 ▼                                    │ switch / stop /           │
//        │         │           ┌──────────┐ ◀─────────────────────────────┴─ restart_on_failure ─────┘
//        │         └────────── │ stopping │  SIGTERM → grace → SIGKILL → no process of the
//        │  group gone AND     └──────────┘  launch left (cgroup, marker, session) → GPU memory released
//        │  VRAM released            │
//        └───────────────────────────┘  (a member stuck in D, or VRAM never released → failed,
//                                         and the next launch is blocked with that message)
//
// An `unhealthy` engine still runs but gets no new requests (its leases are refused); it exits →
// failed, like a ready one.
// A switch from `ready` first runs preflight's declaration checks (those stopping the engine
// cannot change) while the slot stays `ready`: a refusal there is no transition at all.
// A switch from `failed` or `starting` goes through `stopping` too (a full reap: any process of
// the last launch is killed and the /dev/shm files are reaped) so the slot never wedges.
#pragma once

#include <string_view>

#include "gateway/supervisor/slot_control.hpp"

namespace servedeck::supervisor {

using gateway::SlotState;

/// Whether the supervisor may move a slot from `from` to `to` (the diagram above). Staying in
/// the same state is not a transition.
bool allowed_transition(SlotState from, SlotState to);

}  // namespace servedeck::supervisor
