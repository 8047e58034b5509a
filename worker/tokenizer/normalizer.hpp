// Normaliser of a tokenizer.json (`normalizer`): null, {"type":"NFC"}, or a "Sequence" of those
// (an empty Sequence, as in DeepSeek-V3, is the identity). Other normalisers are rejected at load
// with the list of supported ones.
//
// Thread-safety: immutable after construction.
#pragma once

#include <string>
#include <string_view>

#include <nlohmann/json_fwd.hpp>

namespace servedeck::worker {

class Normalizer {
 public:
  Normalizer() = default;
  /// Throws TokenizerError naming `origin` and the offending field.
  Normalizer(const nlohmann::json& config, const std::string& origin);

  /// Normalises valid UTF-8 `text`; returns a view of `text` itself when nothing changes, otherwise
  /// of `storage`, which receives the normalised text.
  std::string_view apply_view(std::string_view text, std::string& storage) const;
  std::string apply(std::string_view text) const;
  bool is_identity() const { return !nfc_; }

 private:
  bool nfc_ = false;
};

}  // namespace servedeck::worker
