#include "worker/tokenizer/byte_level.hpp"

#include "worker/tokenizer/utf8.hpp"

namespace servedeck::worker::byte_level {
namespace {

struct Tables {
  std::array<char32_t, 256> char_of{};
  std::array<short, 0x144> byte_of{};  // every alphabet code point is below U+0144
};

constexpr bool stands_for_itself(unsigned b) {
  return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

constexpr Tables make_tables() {
  Tables t;
  for (auto& v : t.byte_of) v = -1;
  char32_t next = 0x100;
  for (unsigned b = 0; b < 256; ++b) {
    const char32_t cp = stands_for_itself(b) ? char32_t(b) : next++;
    t.char_of[b] = cp;
    t.byte_of[cp] = static_cast<short>(b);
  }
  return t;
}

constexpr Tables k_tables = make_tables();

}  // namespace

char32_t char_of_byte(unsigned char b) { return k_tables.char_of[b]; }

int byte_of_char(char32_t cp) { return cp < k_tables.byte_of.size() ? k_tables.byte_of[cp] : -1; }

std::optional<std::string> to_bytes(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (std::size_t i = 0; i < text.size();) {
    const std::size_t n = utf8::valid_sequence_length(text, i);
    if (n == 0) return std::nullopt;
    const int b = byte_of_char(utf8::decode_at(text, i, n));
    if (b < 0) return std::nullopt;
    out.push_back(static_cast<char>(b));
    i += n;
  }
  return out;
}

std::string from_bytes(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (const char c : bytes) utf8::append(out, char_of_byte(static_cast<unsigned char>(c)));
  return out;
}

}  // namespace servedeck::worker::byte_level
