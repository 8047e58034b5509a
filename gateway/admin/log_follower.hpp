// Following a launch log for `GET /admin/logs?follow=1`: the last lines, then every byte the
// engine appends, as a text/plain stream, until the client goes away.
//
// Bounded: each poll reads at most FollowOptions::max_read_bytes of what the log grew by (a
// log that grew by more is sent in several reads, without waiting between them), and no read
// happens while more than max_queued_bytes still wait for the client. A truncated log (copy-
// truncate rotation) is followed from its new beginning.
//
// Thread-safety: runs on its own thread (one per follower); `res` is a Responder, safe to call
// from any thread.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "common/http/server.hpp"

namespace servedeck::admin {

struct FollowOptions {
  int poll_ms = 200;  // wait between polls of the file's size, ms
  /// note: 1 MiB a read keeps a follower's memory small whatever the engine writes at once (a
  /// model's load can dump megabytes of warnings between two polls).
  std::size_t max_read_bytes = 1u << 20;
  /// No read while the client has this much queued and unread (the server closes a connection
  /// that stays above its 8 MiB stuck-client bound).
  std::size_t max_queued_bytes = 4u << 20;
};

/// Streams the last `lines` lines of the log at `path`, then what is appended, to `res`, until
/// the client goes away; then ends the stream. Never throws: a failure (an exception from reading
/// the file or writing to the client) ends the stream with the line
/// "servedeck: following <path> stopped: <what>" and is returned, for the caller to log.
/// Returns "" when the follow ended because the client went away.
std::string follow_log(const std::string& path, int lines, const std::shared_ptr<http::Responder>& res,
                       const FollowOptions& options = {});

}  // namespace servedeck::admin
