// capture (issue 7 §8). Writes each exchange (request body as sent to the engine, response body or
// the list of streamed chunks) to a file, for debugging a model's behaviour.
//
// PRIVACY: a capture holds EVERYTHING USERS TYPED (prompts, pasted code, file contents read by
// tools, secrets in them). It is off by default and writes only when BOTH the model's policy
// enables it (PolicyConfig::capture) AND the daemon's environment has SERVEDECK_CAPTURE=1. The
// directory is created 0700 (an existing one is chmod'ed to 0700), each file 0600 (O_EXCL, never
// overwritten). Retention: after each write, files beyond max_files (oldest first) and files older
// than max_age are deleted. The predecessor wrote to /tmp with no retention; that is what this
// replaces.
//
// Thread-safety: capture_exchange may be called from any thread (one internal mutex).
#pragma once

#include <chrono>
#include <cstddef>
#include <optional>
#include <string>

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

}  // namespace servedeck::policies
