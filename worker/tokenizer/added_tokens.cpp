#include "worker/tokenizer/added_tokens.hpp"

#include <algorithm>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "worker/tokenizer/utf8.hpp"

namespace servedeck::worker {
namespace {

// Word character for single_word: letters, numbers and '_' (PCRE2 UCP \w).
bool is_word_cp(char32_t cp) {
  if (cp < 0x80) return (cp >= '0' && cp <= '9') || (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z') || cp == '_';
  static pcre2_code* code = [] {
    int err = 0;
    PCRE2_SIZE off = 0;
    return pcre2_compile(reinterpret_cast<PCRE2_SPTR>("^\\w$"), PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP, &err, &off, nullptr);
  }();
  if (code == nullptr) return false;
  std::string s;
  utf8::append(s, cp);
  pcre2_match_data* md = pcre2_match_data_create(1, nullptr);
  const int rc = pcre2_match(code, reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(), 0, 0, md, nullptr);
  pcre2_match_data_free(md);
  return rc >= 0;
}

// Code point ending at text[0..end).
char32_t last_cp(std::string_view text, std::size_t end, std::size_t& start) {
  start = end;
  do {
    --start;
  } while (start > 0 && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80);
  const std::size_t n = utf8::valid_sequence_length(text, start);
  return n == end - start ? utf8::decode_at(text, start, n) : 0xFFFD;
}

char32_t first_cp(std::string_view text, std::size_t begin, std::size_t& len) {
  len = utf8::valid_sequence_length(text, begin);
  if (len == 0) {
    len = 1;
    return 0xFFFD;
  }
  return utf8::decode_at(text, begin, len);
}

}  // namespace

bool is_white_space(char32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F ||
         cp == 0x3000;
}

std::int32_t AddedTokenMatcher::child(std::int32_t node, unsigned char b) const {
  if (node == 0) return root_[b];
  const auto& ch = nodes_[static_cast<std::size_t>(node)].children;
  const auto it = std::lower_bound(ch.begin(), ch.end(), b, [](const auto& p, unsigned char x) { return p.first < x; });
  return (it != ch.end() && it->first == b) ? it->second : -1;
}

void AddedTokenMatcher::add(const AddedToken& token) {
  if (token.content.empty()) return;
  std::int32_t node = 0;
  for (const char c : token.content) {
    const auto b = static_cast<unsigned char>(c);
    std::int32_t next = child(node, b);
    if (next < 0) {
      next = static_cast<std::int32_t>(nodes_.size());
      nodes_.push_back(Node{});
      if (node == 0) {
        root_[b] = next;
      } else {
        auto& ch = nodes_[static_cast<std::size_t>(node)].children;
        const auto it = std::lower_bound(ch.begin(), ch.end(), b, [](const auto& p, unsigned char x) { return p.first < x; });
        ch.insert(it, {b, next});
      }
    }
    node = next;
  }
  auto& slot = nodes_[static_cast<std::size_t>(node)].token;
  if (slot >= 0) {
    tokens_[static_cast<std::size_t>(slot)] = token;  // same content twice: the later entry wins
  } else {
    slot = static_cast<std::int32_t>(tokens_.size());
    tokens_.push_back(token);
  }
}

void AddedTokenMatcher::split(std::string_view text, bool parse_special, std::vector<AddedSegment>& out) const {
  std::size_t emitted = 0;  // end of what has been emitted (HF start_offset)
  std::size_t i = 0;
  while (i < text.size()) {
    // Longest token starting at i.
    std::int32_t node = root_[static_cast<unsigned char>(text[i])];
    if (node < 0) {
      ++i;
      continue;
    }
    std::int32_t best = -1;
    std::size_t best_end = 0;
    for (std::size_t j = i + 1;; ++j) {
      const std::int32_t tok = nodes_[static_cast<std::size_t>(node)].token;
      if (tok >= 0) {
        best = tok;
        best_end = j;
      }
      if (j >= text.size()) break;
      node = child(node, static_cast<unsigned char>(text[j]));
      if (node < 0) break;
    }
    if (best < 0) {
      ++i;
      continue;
    }
    const AddedToken& t = tokens_[static_cast<std::size_t>(best)];
    std::size_t start = i;
    std::size_t stop = best_end;
    i = best_end;  // the matcher resumes after the match even when it is discarded below
    if (t.special && !parse_special) continue;
    if (t.single_word) {
      std::size_t pos = 0, len = 0;
      const bool word_before = start > 0 && is_word_cp(last_cp(text, start, pos));
      const bool word_after = stop < text.size() && is_word_cp(first_cp(text, stop, len));
      if (word_before || word_after) continue;
    }
    if (t.lstrip) {
      std::size_t s = start;
      while (s > emitted) {
        std::size_t p = 0;
        if (!is_white_space(last_cp(text, s, p))) break;
        s = p;
      }
      start = s;
    }
    if (t.rstrip) {
      while (stop < text.size()) {
        std::size_t len = 0;
        if (!is_white_space(first_cp(text, stop, len))) break;
        stop += len;
      }
      i = std::max(i, stop);
    }
    if (start > emitted) out.push_back({-1, emitted, start});
    out.push_back({t.id, start, stop});
    emitted = stop;
  }
  if (emitted < text.size()) out.push_back({-1, emitted, text.size()});
}

}  // namespace servedeck::worker
