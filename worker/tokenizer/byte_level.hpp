// The byte-level alphabet of GPT-2 style BPE ("bytes_to_unicode" in the GPT-2 encoder, reproduced
// by the Hugging Face tokenizers ByteLevel pre-tokenizer and decoder): each of the 256 byte values is
// shown as one printable code point, so a vocabulary entry is a string of those code points.
// Bytes 0x21-0x7E, 0xA1-0xAC and 0xAE-0xFF stand for themselves; the other 68 bytes map, in
// increasing order, to U+0100, U+0101, ... (space 0x20 -> U+0120 'Ġ', newline 0x0A -> U+010A 'Ċ').
//
// Thread-safety: pure functions over constant tables.
#pragma once

#include <array>
#include <optional>
#include <string>
#include <string_view>

namespace servedeck::worker::byte_level {

/// The code point that stands for byte `b`.
char32_t char_of_byte(unsigned char b);

/// The byte a code point stands for, or -1 when it is not in the byte-level alphabet.
int byte_of_char(char32_t cp);

/// Decodes a byte-level string (UTF-8 of alphabet code points) to the raw bytes it stands for;
/// nullopt when it holds invalid UTF-8 or a code point outside the alphabet.
std::optional<std::string> to_bytes(std::string_view byte_level_text);

/// Encodes raw bytes as a byte-level string (the inverse of to_bytes).
std::string from_bytes(std::string_view bytes);

}  // namespace servedeck::worker::byte_level
