// Pre-tokenizer of a Hugging Face tokenizer.json: splits normalised text into "words" that BPE then
// encodes independently. Supported (as in Qwen3, DeepSeek-V3, GLM and GPT-2 style checkpoints):
//   {"type":"Sequence","pretokenizers":[...]} of the two below, or one of them alone;
//   {"type":"Split","pattern":{"Regex":R}|{"String":S},"behavior":B,"invert":bool}
//       B one of Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous;
//   {"type":"ByteLevel","add_prefix_space":bool,"use_regex":bool} (the byte->char mapping itself is
//       implicit: we run BPE on raw bytes; use_regex applies the GPT-2 split pattern).
// Regexes run on PCRE2 in UTF + UCP mode with JIT. `\s` and `\S` are rewritten to the Unicode
// White_Space property (what the reference's Oniguruma/Rust `\s` match); PCRE2's own `\s` would also
// match U+180E. `\S` inside a character class is left to PCRE2.
//
// Thread-safety: immutable after construction; split() may run concurrently (per-thread match data).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace servedeck::worker {

/// How a Split step treats the matched parts (Hugging Face SplitDelimiterBehavior).
enum class SplitBehavior { removed, isolated, merged_with_previous, merged_with_next, contiguous };
const char* to_string(SplitBehavior b);

/// A compiled PCRE2 regex (UTF, UCP, JIT). Move-only.
class Regex {
 public:
  /// Compiles `pattern` (Oniguruma/HF syntax as found in tokenizer.json). Throws TokenizerError
  /// naming `where` (e.g. "tokenizer.json: pre_tokenizer.pretokenizers[0].pattern.Regex") and the
  /// PCRE2 message with its offset.
  Regex(std::string_view pattern, const std::string& where);
  Regex(Regex&&) noexcept;
  Regex& operator=(Regex&&) noexcept;
  ~Regex();

  /// Finds the first non-empty match in text[from..]; returns false when none. `text` must be valid
  /// UTF-8 and `from` a code point boundary. On a PCRE2 run-time error (e.g. a resource limit) the
  /// rest of the text is treated as unmatched.
  bool find(std::string_view text, std::size_t from, std::size_t& begin, std::size_t& end) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// Receives the pre-tokenized words (views valid only during the call).
class WordSink {
 public:
  virtual void word(std::string_view w) = 0;

 protected:
  ~WordSink() = default;
};

class PreTokenizer {
 public:
  /// Builds from the `pre_tokenizer` JSON value (null means: the whole text is one word).
  /// `origin` names the file in errors.
  PreTokenizer(const nlohmann::json& config, const std::string& origin);
  PreTokenizer(PreTokenizer&&) noexcept;
  PreTokenizer& operator=(PreTokenizer&&) noexcept;
  ~PreTokenizer();

  /// Splits valid UTF-8 `text` and hands every non-empty word, in order, to `sink`.
  void split(std::string_view text, WordSink& sink) const;

  struct Step;  // one split step (defined in pre_tokenizer.cpp)

 private:
  void run(std::size_t step, std::string_view text, WordSink& sink) const;
  std::vector<Step> steps_;
};

/// Rewrites `\s` / `\S` (outside and `\s` inside classes) to explicit White_Space classes.
std::string translate_whitespace_classes(std::string_view pattern);

}  // namespace servedeck::worker
