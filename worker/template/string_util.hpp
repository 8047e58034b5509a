// Python str operations on UTF-8 strings for the chat-template interpreter. Whitespace is
// Python's str.isspace() set; case mapping is ASCII-only (non-ASCII letters unchanged).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace servedeck::worker::tmpl {

/// str.strip/lstrip/rstrip: `chars` null = Python whitespace, else the set of code points
/// in *chars.
std::string py_strip(std::string_view s, const std::string* chars, bool left, bool right);
/// str.split()/rsplit() with no separator: runs of whitespace, no empty parts.
std::vector<std::string> py_split_whitespace(std::string_view s, int64_t maxsplit, bool from_right);
/// str.split(sep)/rsplit(sep): `sep` non-empty.
std::vector<std::string> py_split(std::string_view s, std::string_view sep, int64_t maxsplit, bool from_right);
/// str.replace(old, new, count); count < 0 = all. Empty `old` inserts between code points.
std::string py_replace(std::string_view s, std::string_view from, std::string_view to, int64_t count);
std::string ascii_upper(std::string_view s);
std::string ascii_lower(std::string_view s);
/// str.title(): a letter after a non-letter is uppercased, other letters lowercased.
std::string py_title(std::string_view s);
/// str.capitalize(): first character upper, the rest lower.
std::string py_capitalize(std::string_view s);
/// jinja2's `title` filter: words split at whitespace, '-', and opening brackets; first
/// character upper, rest lower.
std::string jinja_title(std::string_view s);
/// str.isdigit/isalpha/isalnum/isspace/islower/isupper (ASCII classes).
bool py_is(std::string_view s, std::string_view which);
/// markupsafe.escape: & < > " ' -> &amp; &lt; &gt; &#34; &#39;
std::string html_escape(std::string_view s);

}  // namespace servedeck::worker::tmpl
