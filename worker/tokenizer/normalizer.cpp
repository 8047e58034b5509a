#include "worker/tokenizer/normalizer.hpp"

#include <nlohmann/json.hpp>

#include "worker/tokenizer/tokenizer.hpp"
#include "worker/tokenizer/unicode_nfc.hpp"

namespace servedeck::worker {
namespace {

void parse(const nlohmann::json& cfg, const std::string& where, bool& nfc) {
  if (cfg.is_null()) return;
  if (!cfg.is_object() || !cfg.contains("type")) throw TokenizerError(where + ": expected an object with a 'type'");
  const auto& type = cfg.at("type");
  if (type == "NFC") {
    nfc = true;
  } else if (type == "Sequence") {
    if (!cfg.contains("normalizers") || !cfg.at("normalizers").is_array())
      throw TokenizerError(where + ".normalizers: expected an array");
    const auto& list = cfg.at("normalizers");
    for (std::size_t i = 0; i < list.size(); ++i) parse(list[i], where + ".normalizers[" + std::to_string(i) + "]", nfc);
  } else {
    throw TokenizerError(where + ".type: unsupported normalizer " + type.dump() + " (supported: NFC, Sequence of NFC, null)");
  }
}

}  // namespace

Normalizer::Normalizer(const nlohmann::json& config, const std::string& origin) { parse(config, origin + ": normalizer", nfc_); }

std::string_view Normalizer::apply_view(std::string_view text, std::string& storage) const {
  if (!nfc_ || nfc_quick_check(text)) return text;
  storage = nfc_normalize(text);
  return storage;
}

std::string Normalizer::apply(std::string_view text) const {
  std::string storage;
  return std::string(apply_view(text, storage));
}

}  // namespace servedeck::worker
