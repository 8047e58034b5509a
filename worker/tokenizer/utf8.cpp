#include "worker/tokenizer/utf8.hpp"

#include "common/utf8_encode.hpp"

namespace servedeck::worker::utf8 {
namespace {

// note: the accepted second-byte ranges per lead byte are Table 3-7 of the Unicode standard
// ("Well-Formed UTF-8 Byte Sequences").
struct LeadInfo {
  std::uint8_t length;
  std::uint8_t second_lo;
  std::uint8_t second_hi;
};

constexpr LeadInfo lead_info(std::uint8_t b) {
  if (b < 0x80) return {1, 0, 0};
  if (b < 0xC2) return {0, 0, 0};
  if (b < 0xE0) return {2, 0x80, 0xBF};
  if (b == 0xE0) return {3, 0xA0, 0xBF};
  if (b < 0xED) return {3, 0x80, 0xBF};
  if (b == 0xED) return {3, 0x80, 0x9F};
  if (b < 0xF0) return {3, 0x80, 0xBF};
  if (b == 0xF0) return {4, 0x90, 0xBF};
  if (b < 0xF4) return {4, 0x80, 0xBF};
  if (b == 0xF4) return {4, 0x80, 0x8F};
  return {0, 0, 0};
}

// Number of bytes starting at s[i] that form a valid (possibly incomplete) prefix, and whether the
// sequence is complete.
std::size_t valid_prefix(std::string_view s, std::size_t i, bool& complete) {
  const auto b0 = static_cast<std::uint8_t>(s[i]);
  const LeadInfo info = lead_info(b0);
  complete = false;
  if (info.length == 0) return 0;
  if (info.length == 1) {
    complete = true;
    return 1;
  }
  std::size_t n = 1;
  for (; n < info.length; ++n) {
    if (i + n >= s.size()) return n;  // truncated
    const auto b = static_cast<std::uint8_t>(s[i + n]);
    const std::uint8_t lo = n == 1 ? info.second_lo : 0x80;
    const std::uint8_t hi = n == 1 ? info.second_hi : 0xBF;
    if (b < lo || b > hi) return n;
  }
  complete = true;
  return n;
}

}  // namespace

std::size_t valid_sequence_length(std::string_view s, std::size_t i) {
  bool complete = false;
  const std::size_t n = valid_prefix(s, i, complete);
  return complete ? n : 0;
}

char32_t decode_at(std::string_view s, std::size_t i, std::size_t len) {
  const auto b0 = static_cast<std::uint8_t>(s[i]);
  if (len == 1) return b0;
  char32_t cp = b0 & (len == 2 ? 0x1F : len == 3 ? 0x0F : 0x07);
  for (std::size_t k = 1; k < len; ++k) cp = (cp << 6) | (static_cast<std::uint8_t>(s[i + k]) & 0x3F);
  return cp;
}

void append(std::string& out, char32_t cp) { servedeck::append_utf8(out, cp); }

std::size_t truncated_prefix_length(std::string_view s, std::size_t i) {
  bool complete = false;
  const std::size_t n = valid_prefix(s, i, complete);
  return (!complete && n > 0 && i + n == s.size()) ? n : 0;
}

std::size_t append_lossy(std::string& out, std::string_view bytes, bool hold_truncated_tail) {
  std::size_t i = 0;
  std::size_t run_start = 0;  // start of the pending run of valid bytes, copied in one go
  while (i < bytes.size()) {
    if (static_cast<std::uint8_t>(bytes[i]) < 0x80) {
      ++i;
      continue;
    }
    bool complete = false;
    const std::size_t n = valid_prefix(bytes, i, complete);
    if (complete) {
      i += n;
      continue;
    }
    out.append(bytes.substr(run_start, i - run_start));
    if (n > 0 && i + n == bytes.size() && hold_truncated_tail) return n;
    out.append("\xEF\xBF\xBD");
    i += n == 0 ? 1 : n;
    run_start = i;
  }
  out.append(bytes.substr(run_start));
  return 0;
}

bool is_valid(std::string_view s) {
  for (std::size_t i = 0; i < s.size();) {
    if (static_cast<std::uint8_t>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    const std::size_t n = valid_sequence_length(s, i);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

}  // namespace servedeck::worker::utf8
