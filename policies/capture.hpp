// capture (issue 7 §8). Writes each exchange (request body as sent to the engine, response body or
// the list of streamed chunks) to a file, for debugging a model's behaviour.
//
// PRIVACY: a capture holds EVERYTHING USERS TYPED (prompts, pasted code, file contents read by
// tools, secrets in them). It is off by default and writes only when BOTH the model's policy
// enables it (PolicyConfig::capture) AND the daemon's environment has SERVEDECK_CAPTURE=1. The
// directory is created 0700 (an existing one is chmod'ed to 0700), each file 0600 (O_EXCL, never
// overwritten). Retention: after each write, and at the daemon's start and periodically
// (apply_capture_retention, run by the daemon's Janitor, whether capture is on or not), files
// beyond max_files (oldest first) and files older than max_age are deleted. Only files capture
// wrote are ever counted or deleted: regular files (not links) owned by this user whose names
// have capture's own shape, `<unix ms>-<pid>-<seq>-<model>.json`; anything else in the
// directory is left alone. The predecessor wrote to /tmp with no retention; that is what this
// replaces.
//
// Thread-safety: capture_exchange may be called from any thread (one internal mutex).
#pragma once

#include <chrono>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "registry/model_entry.hpp"

namespace servedeck::policies {

struct CaptureOptions {
  std::string dir;                                        // e.g. <state_dir>/capture
  std::size_t max_files = 200;                            // files kept
  std::chrono::seconds max_age = std::chrono::hours(24 * 7);  // files older than this are deleted
};

/// Sets the options capture_exchange(model, request, response) uses (the gateway calls this
/// once at start-up). Default dir: $SERVEDECK_CAPTURE_DIR, else /var/lib/servedeck/capture.
void configure_capture(CaptureOptions options);

/// True when the model's policy enables capture and SERVEDECK_CAPTURE=1.
bool capture_enabled(const registry::ModelEntry& model);

/// The outcome of one capture call.
struct CaptureResult {
  std::optional<std::string> path;   // the file written
  std::optional<std::string> error;  // what failed (the gateway logs it; never fails a request)
};

/// Writes {"model","time_unix_ms","request","response"} when capture_enabled(model); otherwise
/// does nothing (both fields empty).
CaptureResult capture_exchange(const registry::ModelEntry& model, const nlohmann::json& request,
                               const nlohmann::json& response);

/// Same, with explicit options (tests).
CaptureResult capture_exchange(const registry::ModelEntry& model, const nlohmann::json& request,
                               const nlohmann::json& response, const CaptureOptions& options);

/// Applies retention to the capture directory of configure_capture() (or `options`): deletes
/// capture's own files beyond max_files and older than max_age. Returns how many it deleted; a
/// missing directory is 0. Never throws.
std::size_t apply_capture_retention();
std::size_t apply_capture_retention(const CaptureOptions& options);

/// True for a file name capture_exchange writes: `<digits>-<digits>-<digits>-<name>.json` with
/// <name> made of [A-Za-z0-9._-].
bool is_capture_file_name(std::string_view name);

}  // namespace servedeck::policies
