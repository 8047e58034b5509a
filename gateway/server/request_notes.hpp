// The notes a bridge's request translation makes (gateway/anthropic, gateway/responses: what it
// dropped, renamed or ignored), written to the daemon's stderr. Their text quotes the client
// (block types, tool names, call ids, the model id), so it is written as hostile text: it can
// neither forge log lines nor flood the log.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace servedeck::gateway {

/// Most notes logged for one request; the rest are counted in one more line.
inline constexpr std::size_t k_max_logged_notes = 8;
/// Longest note (and model id) logged, bytes; a longer one is cut and marked "…".
inline constexpr std::size_t k_max_note_bytes = 300;

/// `text` as part of one log line: control characters (bytes below 0x20, and 0x7f) written as
/// `\xNN`, cut at `max_bytes` input bytes (never inside a UTF-8 sequence) with "…" appended.
std::string log_safe(std::string_view text, std::size_t max_bytes = k_max_note_bytes);

/// Writes "servedeck: ROUTE (MODEL): NOTE" for the first k_max_logged_notes notes (each through
/// log_safe), then "servedeck: ROUTE (MODEL): N more note(s) not logged" when there are more.
void log_request_notes(std::string_view route, std::string_view model, const std::vector<std::string>& notes);

/// Bytes of a client identifier (a model id, a previous_response_id) kept verbatim where an
/// error quotes it or the request log stores it; registry ids are at most 64.
inline constexpr std::size_t k_max_quoted_id_bytes = 128;

/// A client-supplied identifier as an error quotes it and the request log stores it: unchanged
/// up to k_max_quoted_id_bytes, else log_safe's cut (between UTF-8 characters, "…") followed by
/// " (N bytes)", N the full length — so a 10 MiB id is neither echoed nor stored whole.
std::string quoted_client_id(std::string_view id);

}  // namespace servedeck::gateway
