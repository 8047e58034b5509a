// UTF-8 helpers shared by the tokenizer: validation, code point decoding and the lossy conversion
// that Rust's String::from_utf8_lossy performs (each maximal invalid subpart becomes one U+FFFD, the
// Unicode "substitution of maximal subparts" practice, Unicode 15 §3.9 U+FFFD substitution).
//
// Thread-safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace servedeck::worker::utf8 {

/// Length in bytes of the valid UTF-8 sequence starting at s[i], or 0 when the bytes at s[i] are not
/// a complete valid sequence (bad lead, bad continuation, overlong, surrogate, > U+10FFFF, truncated).
std::size_t valid_sequence_length(std::string_view s, std::size_t i);

/// Decodes the valid sequence at s[i] of length `len` (as returned by valid_sequence_length).
char32_t decode_at(std::string_view s, std::size_t i, std::size_t len);

/// Appends the UTF-8 encoding of `cp` (must be a scalar value) to `out`.
void append(std::string& out, char32_t cp);

/// Length of the longest prefix of s[i..] that could still become a valid sequence if more bytes
/// came (1..3), or 0 when s[i..] is not such a truncated prefix. Used by the stream decoder.
std::size_t truncated_prefix_length(std::string_view s, std::size_t i);

/// Appends `bytes` to `out`, replacing each maximal invalid subpart by U+FFFD (from_utf8_lossy).
/// When `hold_truncated_tail` is true, a final truncated-but-valid prefix is not converted and its
/// length is returned (so the caller can hold it back); otherwise it becomes U+FFFD and 0 is returned.
std::size_t append_lossy(std::string& out, std::string_view bytes, bool hold_truncated_tail = false);

/// True when `s` is entirely valid UTF-8.
bool is_valid(std::string_view s);

}  // namespace servedeck::worker::utf8
