#include "worker/template/string_util.hpp"

#include <algorithm>

#include "worker/template/value.hpp"

namespace servedeck::worker::tmpl {

namespace {

struct CodePoint {
  uint32_t cp;
  size_t begin;
  size_t end;
};

std::vector<CodePoint> code_points(std::string_view s) {
  std::vector<CodePoint> out;
  const auto offs = utf8_offsets(s);
  for (size_t i = 0; i + 1 < offs.size(); ++i) {
    const size_t b = offs[i];
    const size_t e = offs[i + 1];
    uint32_t cp = static_cast<unsigned char>(s[b]);
    if (e - b > 1) {
      cp &= (e - b == 2) ? 0x1F : (e - b == 3) ? 0x0F : 0x07;
      for (size_t k = b + 1; k < e; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[k]) & 0x3F);
    }
    out.push_back({cp, b, e});
  }
  return out;
}

// Python str.isspace() code points.
bool is_py_space(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F ||
         cp == 0x3000;
}

bool is_alpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
char up(char c) { return (c >= 'a' && c <= 'z') ? static_cast<char>(c - 32) : c; }
char low(char c) { return (c >= 'A' && c <= 'Z') ? static_cast<char>(c + 32) : c; }

}  // namespace

std::string py_strip(std::string_view s, const std::string* chars, bool left, bool right) {
  const auto cps = code_points(s);
  std::vector<uint32_t> set;
  if (chars) {
    for (const auto& c : code_points(*chars)) set.push_back(c.cp);
  }
  auto strip_it = [&](uint32_t cp) {
    return chars ? std::find(set.begin(), set.end(), cp) != set.end() : is_py_space(cp);
  };
  size_t lo = 0;
  size_t hi = cps.size();
  if (left) {
    while (lo < hi && strip_it(cps[lo].cp)) ++lo;
  }
  if (right) {
    while (hi > lo && strip_it(cps[hi - 1].cp)) --hi;
  }
  if (lo >= hi) return {};
  return std::string(s.substr(cps[lo].begin, cps[hi - 1].end - cps[lo].begin));
}

std::vector<std::string> py_split_whitespace(std::string_view s, int64_t maxsplit, bool from_right) {
  const auto cps = code_points(s);
  // Word spans [begin, end) in bytes.
  std::vector<std::pair<size_t, size_t>> words;
  for (size_t i = 0; i < cps.size();) {
    while (i < cps.size() && is_py_space(cps[i].cp)) ++i;
    if (i >= cps.size()) break;
    const size_t b = i;
    while (i < cps.size() && !is_py_space(cps[i].cp)) ++i;
    words.emplace_back(cps[b].begin, cps[i - 1].end);
  }
  std::vector<std::string> out;
  if (maxsplit < 0 || static_cast<size_t>(maxsplit) >= words.size()) {
    for (const auto& [b, e] : words) out.emplace_back(s.substr(b, e - b));
    return out;
  }
  const auto m = static_cast<size_t>(maxsplit);
  if (!from_right) {
    for (size_t i = 0; i < m; ++i) out.emplace_back(s.substr(words[i].first, words[i].second - words[i].first));
    // The rest keeps its trailing whitespace but not the leading one.
    out.push_back(py_strip(s.substr(words[m].first), nullptr, true, false));
    return out;
  }
  const size_t keep = words.size() - m;
  out.push_back(py_strip(s.substr(0, words[keep - 1].second), nullptr, true, false));
  for (size_t i = keep; i < words.size(); ++i) out.emplace_back(s.substr(words[i].first, words[i].second - words[i].first));
  return out;
}

std::vector<std::string> py_split(std::string_view s, std::string_view sep, int64_t maxsplit, bool from_right) {
  std::vector<std::string> out;
  if (!from_right) {
    size_t start = 0;
    int64_t n = 0;
    while (maxsplit < 0 || n < maxsplit) {
      const size_t p = s.find(sep, start);
      if (p == std::string_view::npos) break;
      out.emplace_back(s.substr(start, p - start));
      start = p + sep.size();
      ++n;
    }
    out.emplace_back(s.substr(start));
    return out;
  }
  size_t end = s.size();
  int64_t n = 0;
  std::vector<std::string> rev;
  while (maxsplit < 0 || n < maxsplit) {
    if (end < sep.size()) break;
    const size_t p = s.rfind(sep, end - sep.size());
    if (p == std::string_view::npos) break;
    rev.emplace_back(s.substr(p + sep.size(), end - p - sep.size()));
    end = p;
    ++n;
  }
  rev.emplace_back(s.substr(0, end));
  out.assign(rev.rbegin(), rev.rend());
  return out;
}

std::string py_replace(std::string_view s, std::string_view from, std::string_view to, int64_t count) {
  std::string out;
  if (from.empty()) {
    const auto offs = utf8_offsets(s);
    int64_t n = 0;
    for (size_t i = 0; i + 1 < offs.size(); ++i) {
      if (count < 0 || n < count) {
        out.append(to);
        ++n;
      }
      out.append(s.substr(offs[i], offs[i + 1] - offs[i]));
    }
    if (count < 0 || n < count) out.append(to);
    return out;
  }
  size_t start = 0;
  int64_t n = 0;
  while (count < 0 || n < count) {
    const size_t p = s.find(from, start);
    if (p == std::string_view::npos) break;
    out.append(s.substr(start, p - start));
    out.append(to);
    start = p + from.size();
    ++n;
  }
  out.append(s.substr(start));
  return out;
}

std::string ascii_upper(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = up(c);
  return out;
}

std::string ascii_lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = low(c);
  return out;
}

std::string py_title(std::string_view s) {
  std::string out(s);
  bool prev_cased = false;
  for (char& c : out) {
    if (is_alpha(c)) {
      c = prev_cased ? low(c) : up(c);
      prev_cased = true;
    } else {
      // note: non-ASCII bytes count as cased so "élan" does not become "éLan".
      prev_cased = static_cast<unsigned char>(c) >= 0x80;
    }
  }
  return out;
}

std::string py_capitalize(std::string_view s) {
  std::string out = ascii_lower(s);
  if (!out.empty()) out[0] = up(out[0]);
  return out;
}

std::string jinja_title(std::string_view s) {
  std::string out;
  bool word_start = true;
  for (char c : s) {
    const bool sep = c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v' || c == '-' ||
                     c == '(' || c == '{' || c == '[' || c == '<';
    if (sep) {
      out.push_back(c);
      word_start = true;
    } else {
      out.push_back(word_start ? up(c) : low(c));
      word_start = false;
    }
  }
  return out;
}

bool py_is(std::string_view s, std::string_view which) {
  if (s.empty()) return false;
  bool any_cased = false;
  for (char c : s) {
    const bool digit = c >= '0' && c <= '9';
    const bool space = c == ' ' || (c >= '\t' && c <= '\r');
    if (which == "isdigit" && !digit) return false;
    if (which == "isalpha" && !is_alpha(c)) return false;
    if (which == "isalnum" && !is_alpha(c) && !digit) return false;
    if (which == "isspace" && !space) return false;
    if (which == "islower" && c >= 'A' && c <= 'Z') return false;
    if (which == "isupper" && c >= 'a' && c <= 'z') return false;
    if (is_alpha(c)) any_cased = true;
  }
  if (which == "islower" || which == "isupper") return any_cased;
  return true;
}

std::string html_escape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out.push_back(c);
    }
  }
  return out;
}

}  // namespace servedeck::worker::tmpl
