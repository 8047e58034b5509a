// Guards for JSON that comes from outside (requests, engine output): nesting depth, checked on
// the raw bytes before parsing (copying or printing a 100k-deep document recurses and overflows
// the stack), and printing that never throws on invalid UTF-8 inside strings.
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

/// Scans `text` (brackets outside strings) and returns an error naming the byte offset where the
/// nesting depth first exceeds `max_depth`, or nullopt. Malformed JSON is left to the parser.
std::optional<std::string> check_json_nesting(std::string_view text, std::size_t max_depth = k_max_json_depth);

/// dump() that replaces invalid UTF-8 with U+FFFD instead of throwing.
std::string dump_safe(const nlohmann::json& j, int indent = -1);

}  // namespace servedeck
