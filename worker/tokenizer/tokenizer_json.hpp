// Reading tokenizer.json in one SAX pass: `model.vocab` and `model.merges` (about 150,000 entries
// each in Qwen3 / DeepSeek-V3) go straight into flat vectors; everything else becomes a small
// nlohmann::json document. note: building the full DOM took ~2 s (Release) and ~8 s (Debug) for
// Qwen3's 11 MB file, mostly in std::map node allocation for the vocabulary.
//
// Thread-safety: pure function.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace servedeck::worker {

struct TokenizerJson {
  nlohmann::json rest;  // the document without model.vocab and model.merges
  bool has_vocab = false;
  bool has_merges = false;
  std::vector<std::pair<std::string, std::int32_t>> vocab;   // (token in byte-level form, id), file order
  std::vector<std::pair<std::string, std::string>> merges;   // (left, right), rank order
};

/// Parses `text`. Throws TokenizerError naming `origin` and the field for invalid JSON, a vocab
/// entry whose id is not an integer in [0, 2^31), or a merge that is neither "left right" (one
/// space) nor [left, right].
TokenizerJson parse_tokenizer_json(std::string_view text, const std::string& origin);

}  // namespace servedeck::worker
