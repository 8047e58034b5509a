// Client-supplied identifiers (a model id, an alias, a previous response id) as they are quoted
// back in an error and stored in the request log: bounded, so that one request cannot make an
// answer or a log row as large as its body (a 10 MiB "model" would otherwise be echoed in the
// 404 and written to the state store on every request).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace servedeck {

/// Bytes of a client identifier kept verbatim; longer ones are cut (registry ids are at most 64).
inline constexpr std::size_t k_max_quoted_id_bytes = 128;

/// `id` unchanged when it has at most k_max_quoted_id_bytes bytes; otherwise its first bytes, cut
/// between UTF-8 characters (a continuation byte never starts the cut), and "… (N bytes)" with N
/// the full length. `id` is expected to be valid UTF-8 (a string of a parsed JSON body); on other
/// bytes the result is still bounded. O(k_max_quoted_id_bytes).
inline std::string quoted_client_id(std::string_view id) {
  if (id.size() <= k_max_quoted_id_bytes) return std::string(id);
  std::size_t cut = k_max_quoted_id_bytes;
  for (int back = 0; back < 3 && cut > 0 && (static_cast<unsigned char>(id[cut]) & 0xC0) == 0x80; ++back) --cut;
  return std::string(id.substr(0, cut)) + "\xE2\x80\xA6 (" + std::to_string(id.size()) + " bytes)";
}

}  // namespace servedeck
