// check_toml_nesting: a single pass over the text with a small lexical state machine.
#include "registry/toml_nesting.hpp"

#include <vector>

namespace servedeck::registry {

namespace {

/// Skips a string starting at text[i] (a quote); returns the index just past its end, or
/// text.size() when it never closes. Multi-line forms (""" and ''') may span lines; `line` is
/// advanced by the newlines skipped.
std::size_t skip_string(std::string_view text, std::size_t i, int& line) {
  const char q = text[i];
  const bool multi = text.substr(i, 3) == std::string_view(q == '"' ? "\"\"\"" : "'''");
  std::size_t j = i + (multi ? 3 : 1);
  while (j < text.size()) {
    const char c = text[j];
    if (c == '\n') {
      ++line;
      if (!multi) return j;  // an unterminated one-line string: toml++ reports it
    }
    if (c == '\\' && q == '"') {
      j += 2;
      continue;
    }
    if (c == q) {
      if (!multi) return j + 1;
      if (text.substr(j, 3) == std::string_view(q == '"' ? "\"\"\"" : "'''")) {
        j += 3;
        while (j < text.size() && text[j] == q) ++j;  // up to two quotes may end the content
        return j;
      }
    }
    ++j;
  }
  return j;
}

}  // namespace

std::optional<TomlNestingError> check_toml_nesting(std::string_view text, int max_segments, int max_brackets) {
  int line = 1;
  std::vector<char> open;  // '[' (array) or '{' (inline table), innermost last; at most max_brackets
  bool line_start = true;  // only blanks since the last newline (outside any bracket)
  bool in_key = false;     // reading a key (before its '=') or a table header
  bool in_header = false;
  int segments = 0;
  auto too_deep = [&](const char* what, int n, int max) {
    return TomlNestingError{line, std::string(what) + " with " + std::to_string(n) + " nesting levels at line " +
                                      std::to_string(line) + "; expected at most " + std::to_string(max)};
  };
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '\n') {
      ++line;
      if (open.empty()) {
        line_start = true;
        in_key = in_header = false;
      }
      continue;
    }
    if (c == ' ' || c == '\t' || c == '\r') continue;
    if (c == '#') {
      while (i + 1 < text.size() && text[i + 1] != '\n') ++i;
      continue;
    }
    if (line_start && open.empty()) {
      line_start = false;
      if (c == '[') {  // a table header, [a.b] or [[a.b]]
        in_header = in_key = true;
        segments = 1;
        if (i + 1 < text.size() && text[i + 1] == '[') ++i;
        continue;
      }
      in_key = true;  // a key = value line
      segments = 1;
    }
    if (c == '"' || c == '\'') {
      i = skip_string(text, i, line) - 1;
      continue;
    }
    if (in_key) {
      if (c == '.') {
        if (++segments > max_segments) return too_deep(in_header ? "a table header" : "a dotted key", segments, max_segments);
      } else if (c == ']' && in_header) {
        in_key = in_header = false;
        if (i + 1 < text.size() && text[i + 1] == ']') ++i;
      } else if (c == '=') {
        in_key = false;
      } else if (c == '}' && !open.empty() && open.back() == '{') {  // {} or a trailing ','
        in_key = false;
        open.pop_back();
      }
      continue;
    }
    // In a value.
    if (c == '[' || c == '{') {
      open.push_back(c);
      if (static_cast<int>(open.size()) > max_brackets)
        return too_deep("an array or inline table", static_cast<int>(open.size()), max_brackets);
      if (c == '{') {
        in_key = true;
        segments = 1;
      }
    } else if (c == ']' || c == '}') {
      if (!open.empty()) open.pop_back();
    } else if (c == ',' && !open.empty() && open.back() == '{') {
      in_key = true;
      segments = 1;
    }
  }
  return std::nullopt;
}

}  // namespace servedeck::registry
