// What `servedeck serve` sets up in its state directory before it serves: the directory's mode
// (and its agreement with a systemd unit's StateDirectory), the admin token, and the Janitor
// that enforces the lifetimes of stored data. docs/operations.md "Security".
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "gateway/state/janitor.hpp"
#include "gateway/state/store.hpp"
#include "registry/model_entry.hpp"

namespace servedeck::cli {

using LogLine = std::function<void(const std::string&)>;

/// How often the daemon's Janitor sweeps after the sweep at start.
constexpr std::chrono::minutes k_janitor_interval{10};

/// Checks that `dir` is the systemd unit's StateDirectory when there is one, then creates or
/// tightens it (state::secure_state_dir; what changed goes to `log`). Returns "" when the daemon
/// may go on, else the message to print before exiting 2. Throws state::StoreError when the
/// directory cannot be made private.
std::string prepare_state_dir(const std::string& dir, const std::string& config_path, const LogLine& log);

/// The store retention the [server] keys ask for (responses_retention_s, history_retention_s,
/// history_max_rows).
state::Retention retention_of(const registry::ServerConfig& server);

/// The daemon's Janitor: prunes `store` with retention_of(server) and applies capture retention,
/// once now and every k_janitor_interval; deletions and failures go to `log`.
std::unique_ptr<state::Janitor> start_janitor(state::Store& store, const registry::ServerConfig& server,
                                              const LogLine& log);

/// Makes a fresh admin token and writes it to <dir>/admin.token (admin/admin_token.hpp). Throws
/// std::runtime_error naming the file.
std::string issue_admin_token(const std::string& dir);

}  // namespace servedeck::cli
