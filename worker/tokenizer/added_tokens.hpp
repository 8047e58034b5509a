// Added tokens of a tokenizer.json (`added_tokens`): matched in the text before normalisation and
// BPE, with the Hugging Face tokenizers rules (AddedVocabulary::find_matches):
//   - leftmost match, longest among those starting there (Aho-Corasick LeftmostLongest);
//   - single_word: the match is dropped when a word character (PCRE2 UCP `\w`) touches either side;
//   - lstrip / rstrip: the token swallows the White_Space run on its left / right;
//   - special tokens are skipped when parse_special is false (HF encode_special_tokens = true);
//     the skipped text then goes through BPE like any other text.
// Tokens with normalized=true are matched on normalised text (a second matcher), the others on raw text.
//
// Thread-safety: immutable after construction; split() may run concurrently.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace servedeck::worker {

struct AddedToken {
  std::string content;
  std::int32_t id = 0;
  bool special = false;
  bool lstrip = false;
  bool rstrip = false;
  bool single_word = false;
  bool normalized = false;
};

/// One piece of split(): either a token id or a text range [begin, end) of the input.
struct AddedSegment {
  std::int32_t id;  // -1 for text
  std::size_t begin;
  std::size_t end;
};

class AddedTokenMatcher {
 public:
  /// Adds a token to the byte trie (content must be non-empty).
  void add(const AddedToken& token);
  bool empty() const { return tokens_.empty(); }

  /// Appends the segments of `text` (valid UTF-8) to `out`, in order; text segments are non-empty.
  void split(std::string_view text, bool parse_special, std::vector<AddedSegment>& out) const;

 private:
  struct Node {
    std::vector<std::pair<unsigned char, std::int32_t>> children;  // sorted by byte
    std::int32_t token = -1;                                       // index into tokens_
  };
  std::int32_t child(std::int32_t node, unsigned char b) const;
  std::vector<Node> nodes_{Node{}};
  std::array<std::int32_t, 256> root_{[] {
    std::array<std::int32_t, 256> a{};
    a.fill(-1);
    return a;
  }()};
  std::vector<AddedToken> tokens_;
};

/// True for Unicode White_Space (what Rust's char::is_whitespace tests).
bool is_white_space(char32_t cp);

}  // namespace servedeck::worker
