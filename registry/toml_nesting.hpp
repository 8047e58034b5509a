// A linear pre-scan of TOML text that bounds how deep its tables can nest, run before toml++
// parses it: toml++ builds a table per dotted-key segment recursively, so a 40,000-segment
// header (`[a.a.a…]`, 80 KB) overflows the stack, and the registry's own walks are quadratic in
// the depth. The scan knows TOML's lexical rules (basic, literal and multi-line strings,
// comments, quoted keys, inline tables, arrays) well enough to count key segments and bracket
// depth; it does not validate anything else (toml++ does).
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace servedeck::registry {

/// What the pre-scan refused: the 1-based line and a message naming what was read.
struct TomlNestingError {
  int line = 0;
  std::string message;
};

/// Checks that no table header or key has more than `max_segments` dotted segments and that
/// arrays and inline tables nest at most `max_brackets` deep. O(text.size()), no allocation
/// beyond the returned error. nullopt when within bounds (or when the text is not TOML enough to
/// tell: toml++ then reports the syntax error itself).
std::optional<TomlNestingError> check_toml_nesting(std::string_view text, int max_segments, int max_brackets);

}  // namespace servedeck::registry
