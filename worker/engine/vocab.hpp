// What the engine needs to know about tokens to produce text: their raw bytes and whether they
// are special (special tokens are not emitted as text, as vLLM's skip_special_tokens=True).
// Implemented over the real Tokenizer by the server's model loader and by fakes in tests.
//
// Thread-safety: implementations must allow concurrent const calls.
#pragma once

#include <cstdint>
#include <string>

namespace servedeck::worker {

class Vocab {
 public:
  virtual ~Vocab() = default;
  /// The raw bytes of token `id` (may be an incomplete UTF-8 sequence). Empty when out of range.
  virtual std::string token_bytes(int32_t id) const = 0;
  /// True for special tokens (e.g. <|im_end|>), whose text is never emitted.
  virtual bool is_special(int32_t id) const = 0;
};

}  // namespace servedeck::worker
