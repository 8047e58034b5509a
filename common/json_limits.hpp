// Untrusted JSON, one way. Every parse of text that came from outside the process (client bodies,
// tool-call argument strings inside them, engine bodies and streamed chunks, probe answers, stored
// documents, log tails) goes through parse_untrusted(), and every serialisation of a value that may
// hold such text goes through dump_safe(). Neither throws.
//
// Why: nlohmann's parser and printer recurse once per nesting level, so a 100k-deep document
// overflows the stack before any handler runs; and dump() throws type_error.316 on a string that is
// not valid UTF-8 (an engine excerpt cut inside a character). tests/common/no_bare_json_test.sh
// fails the build's tests if a bare json::parse( or .dump( appears in the daemon's sources.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace servedeck {

/// Deepest nesting of arrays/objects accepted in a request body. note: real chat requests nest
/// under 20 levels (tool schemas included); 256 leaves room for generous JSON schemas.
inline constexpr std::size_t k_max_json_depth = 256;

/// Bounds of one parse. `max_bytes` is checked before any byte is read; `max_depth` on the raw
/// bytes (brackets outside strings) before the parser runs, so the recursion depth of the parse
/// and of any later dump of the result is at most max_depth.
struct JsonLimits {
  std::size_t max_depth = k_max_json_depth;
  std::size_t max_bytes = 64u * 1024 * 1024;
};

/// Why a parse_untrusted() call returned a discarded value.
struct JsonError {
  std::size_t byte = 0;  // 0-based offset of the offending byte (0 for a size or depth refusal at the start)
  std::string message;   // "malformed JSON at byte 17: syntax error ...", "JSON nested deeper than 256 levels (at byte 256)"
};

/// Scans `text` (brackets outside strings) and returns an error naming the byte offset where the
/// nesting depth first exceeds `max_depth`, or nullopt. Malformed JSON is left to the parser.
/// Linear in text.size().
std::optional<std::string> check_json_nesting(std::string_view text, std::size_t max_depth = k_max_json_depth);

/// Parses `text` as one JSON document within `limits`. Never throws: returns the document, or a
/// discarded value (`is_discarded()`) with `error` (when given) naming the byte and the reason.
/// Linear time in text.size() (nlohmann's parser is single-pass).
nlohmann::json parse_untrusted(std::string_view text, JsonError* error = nullptr, JsonLimits limits = {});

/// dump() that replaces invalid UTF-8 with U+FFFD instead of throwing. `indent` as in
/// nlohmann::json::dump (-1 compact). Safe on any value parse_untrusted() returned.
std::string dump_safe(const nlohmann::json& j, int indent = -1);

}  // namespace servedeck
