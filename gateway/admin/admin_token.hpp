// The admin token: the credential of the admin plane (gateway/server/access.hpp). The daemon
// makes a fresh one each time it starts and writes it to <state_dir>/admin.token; the CLI reads
// that file and sends `Authorization: Bearer <token>`. A browser page cannot read the file, so it
// cannot drive the admin API; a client API key (server.api_keys) is not this token.
//
// The file is 0640: the daemon's user reads and writes it, its group reads it. Who reaches it is
// decided by the state directory's mode (0700: the daemon's user only; the systemd unit's 0710:
// group servedeck too). docs/operations.md "Security".
//
// Thread-safety: free functions, no shared state.
#pragma once

#include <optional>
#include <string>

namespace servedeck::admin {

/// <state_dir>/admin.token
std::string admin_token_path(const std::string& state_dir);

/// A fresh token: 32 bytes from getrandom(2) as 64 lower-case hex digits. Throws
/// std::runtime_error when the kernel gives no random bytes.
std::string new_admin_token();

/// Writes `token` to admin_token_path(state_dir) atomically (a 0640 temporary renamed over the
/// old file, so a reader sees the old token or the new one, never half). Throws
/// std::runtime_error naming the path and the system error.
void write_admin_token(const std::string& state_dir, const std::string& token);

/// The token in admin_token_path(state_dir), or nullopt with `why` ("no <path>", or "cannot read
/// <path>: Permission denied", or "<path> is empty or malformed").
std::optional<std::string> read_admin_token(const std::string& state_dir, std::string& why);

/// Removes the file when it still holds `token` (a daemon exiting leaves another's token alone).
void remove_admin_token(const std::string& state_dir, const std::string& token);

}  // namespace servedeck::admin
