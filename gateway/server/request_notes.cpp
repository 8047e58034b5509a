#include "gateway/server/request_notes.hpp"

#include <cstdio>
#include <iostream>

namespace servedeck::gateway {

std::string log_safe(std::string_view text, std::size_t max_bytes) {
  std::size_t end = text.size();
  const bool cut = end > max_bytes;
  if (cut) {
    end = max_bytes;
    // Back up over continuation bytes (10xxxxxx) and the lead byte they belong to.
    while (end > 0 && (static_cast<unsigned char>(text[end]) & 0xC0) == 0x80) --end;
  }
  std::string out;
  out.reserve(end + 8);
  for (std::size_t i = 0; i < end; ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c < 0x20 || c == 0x7f) {
      char esc[5];
      std::snprintf(esc, sizeof esc, "\\x%02x", c);
      out += esc;
    } else {
      out += static_cast<char>(c);
    }
  }
  if (cut) out += "\xe2\x80\xa6";  // …
  return out;
}

std::string quoted_client_id(std::string_view id) {
  if (id.size() <= k_max_quoted_id_bytes) return std::string(id);
  return log_safe(id, k_max_quoted_id_bytes) + " (" + std::to_string(id.size()) + " bytes)";
}

void log_request_notes(std::string_view route, std::string_view model, const std::vector<std::string>& notes) {
  if (notes.empty()) return;
  const std::string prefix = "servedeck: " + std::string(route) + " (" + log_safe(model) + "): ";
  std::string lines;
  for (std::size_t i = 0; i < notes.size() && i < k_max_logged_notes; ++i) lines += prefix + log_safe(notes[i]) + "\n";
  if (notes.size() > k_max_logged_notes)
    lines += prefix + std::to_string(notes.size() - k_max_logged_notes) + " more note(s) not logged\n";
  std::cerr << lines;
}

}  // namespace servedeck::gateway
