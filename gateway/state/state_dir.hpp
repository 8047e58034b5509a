// The daemon's state directory: who may enter it, and the one rule that names it.
//
// Mode: 0700 (the daemon's user alone), created so and tightened at every start. Under the
// systemd unit, systemd owns the mode (StateDirectory=, StateDirectoryMode=0710: members of
// group servedeck may open the CLI's files, daemon.json and admin.token, by name but cannot list
// the directory or read anything else); the daemon then only removes what 0710 does not allow.
// docs/operations.md "Security".
//
// Thread-safety: free functions, no shared state.
#pragma once

#include <optional>
#include <string>

namespace servedeck::state {

/// Creates `dir` (mode 0700, parents as needed) or tightens an existing one to 0700 — or, when
/// $STATE_DIRECTORY (set by systemd for StateDirectory=) names `dir`, to at most 0710. Returns
/// what it changed ("state directory D was 0755; now 0700"), or "" when nothing. Throws
/// StoreError naming the directory and the system error.
std::string secure_state_dir(const std::string& dir);

/// When the daemon runs under a systemd unit with StateDirectory= ($STATE_DIRECTORY set) and
/// `dir` is not that directory: the message that says so and what to set. The CLI finds the
/// daemon through the config's server.state_dir, so a unit whose directory differs would leave
/// every CLI verb looking in the wrong place. nullopt when they agree or there is no unit.
std::optional<std::string> systemd_state_dir_mismatch(const std::string& dir, const std::string& config_path);

}  // namespace servedeck::state
