// Shared pieces of the `servedeck` CLI verbs: argument parsing, config and state-dir
// resolution, finding the daemon, and talking to its admin API.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace servedeck::registry {
struct Registry;
}

namespace servedeck::cli {

/// Parsed command line: `servedeck [global flags] VERB [args] [flags]` (flags anywhere).
struct Args {
  std::string verb;
  std::vector<std::string> positional;      // after the verb
  std::map<std::string, std::string> opts;  // "--config" → value; boolean flags → "1"
  bool has(const std::string& flag) const { return opts.count(flag) != 0; }
  std::string get(const std::string& flag, const std::string& fallback = "") const;
};

/// Throws std::invalid_argument naming the flag on a missing value or unknown flag.
Args parse_args(int argc, char** argv);

/// --config, else ./models.toml when it exists, else /etc/servedeck/models.toml.
std::string config_path(const Args& a);

/// The config file the CLI would use: --config (as given, even when missing: the reader names
/// it), else ./models.toml when it exists, else /etc/servedeck/models.toml when it exists;
/// nullopt when none of them is there.
std::optional<std::string> found_config(const Args& a);

/// "no models.toml in <cwd> or /etc/servedeck; pass --config FILE" (what to say when
/// found_config() is nullopt).
std::string no_config_message();

/// Where the CLI looks for the daemon's files, and whether it knows or only guesses.
struct StateDir {
  std::string dir;
  /// Empty when `dir` came from --state-dir, $SERVEDECK_STATE_DIR or a config that loads. Else
  /// `dir` is only the default /var/lib/servedeck and this says why (no config found, or the
  /// config does not load) and what to pass; verbs must not call a daemon "down" on a guess.
  std::string guessed_because;
};

/// The one state-directory rule, shared by the daemon and the CLI: --state-dir, else
/// $SERVEDECK_STATE_DIR, else `reg`'s server.state_dir. (The systemd unit passes neither flag nor
/// variable, so the daemon it starts uses the config's state_dir, as the CLI does.)
std::string state_dir_for(const Args& a, const registry::Registry& reg);

/// state_dir_for() with the registry of the config the CLI would use (found_config) when it
/// loads, else /var/lib/servedeck (guessed_because set).
StateDir resolve_state_dir(const Args& a);

/// resolve_state_dir(a).dir.
std::string state_dir(const Args& a);

/// Where the daemon writes its admin address: <state_dir>/daemon.json
/// {"host", "port", "pid", "config", "started_ms"}.
std::string daemon_file(const std::string& state_dir);

struct DaemonAddress {
  std::string host;
  int port = 0;
  int64_t pid = 0;
  /// The admin token from <state_dir>/admin.token, sent as `Authorization: Bearer` on every
  /// admin call; "" when it could not be read (token_problem says why).
  std::string admin_token;
  std::string token_problem;
};

/// The address in daemon.json (and the admin token beside it), or nullopt with `why` when there
/// is none. `*denied` (when given) is set when the file exists but this user may not read it:
/// the daemon may well be running, so verbs must not call it down.
std::optional<DaemonAddress> find_daemon(const std::string& state_dir, std::string& why, bool* denied = nullptr);

/// What to do when the state directory's files cannot be read by this user.
std::string access_hint();

/// For an admin call the daemon refused with 401 while the CLI had no token: " (<why the token
/// could not be read>; <access_hint()>)"; "" otherwise.
std::string admin_refusal_hint(const DaemonAddress& d, int status);

/// GET/POST to the admin API (with the admin token). Throws http::ClientError when the daemon
/// does not answer.
nlohmann::json admin_json(const DaemonAddress& d, const std::string& method, const std::string& target,
                          const nlohmann::json& body, int& status);

/// POSTs to a streaming admin route (/admin/switch, /admin/stop), prints each progress line as it
/// arrives, returns the result event's JSON ({"ok", "error", "seconds"}).
nlohmann::json admin_stream(const DaemonAddress& d, const std::string& target, const nlohmann::json& body,
                            const std::function<void(const std::string&)>& on_line);

/// `servedeck models` as text: one line per entry of `models` (the /admin/models array:
/// {"name", "engine", "ctx", "state", "ids": [...]}), columns name, engine, "ctx N", state, ids,
/// each padded to its longest entry (two spaces between columns). Missing fields print as "" ("-"
/// for ctx).
std::string models_table(const nlohmann::json& models);

// The verbs. Each returns the process exit code.
int cmd_serve(const Args& a);
int cmd_switch(const Args& a);
int cmd_stop(const Args& a);
int cmd_status(const Args& a);
int cmd_soak(const Args& a);     // gateway/cli/tool_verbs.cpp
int cmd_probe(const Args& a);
int cmd_compare(const Args& a);
int cmd_models(const Args& a);
int cmd_logs(const Args& a);
int cmd_lint(const Args& a);
int cmd_preflight(const Args& a);

}  // namespace servedeck::cli
