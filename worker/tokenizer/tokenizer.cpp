// Tokenizer: loading tokenizer.json and the encode/decode pipeline (added tokens -> normaliser ->
// pre-tokenizer -> BPE). See tokenizer.hpp for the contract and docs/tokenizer.md for the design.
#include "worker/tokenizer/tokenizer.hpp"

#include <cstdio>
#include <fstream>
#include <sstream>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "worker/tokenizer/added_tokens.hpp"
#include "worker/tokenizer/bpe.hpp"
#include "worker/tokenizer/byte_level.hpp"
#include "worker/tokenizer/normalizer.hpp"
#include "worker/tokenizer/pre_tokenizer.hpp"
#include "worker/tokenizer/tokenizer_json.hpp"
#include "worker/tokenizer/utf8.hpp"

namespace servedeck::worker {

using nlohmann::json;

struct Tokenizer::Impl {
  std::string origin;
  std::vector<std::string> id_bytes;                     // (vocab_size) raw bytes of each id
  std::vector<std::uint8_t> special;                     // (vocab_size) 1 for special added tokens
  std::unordered_map<std::string, std::int32_t> vocab;   // raw token bytes -> id (model.vocab)
  std::unordered_map<std::string, std::int32_t> added;   // added token content -> id
  std::unique_ptr<BpeModel> bpe;
  Normalizer normalizer;
  std::unique_ptr<PreTokenizer> pre_tokenizer;
  AddedTokenMatcher raw_matcher;         // added tokens with normalized=false
  AddedTokenMatcher normalized_matcher;  // added tokens with normalized=true

  void encode_valid(std::string_view text, bool parse_special, std::vector<std::int32_t>& out) const;
  void encode_section(std::string_view text, bool parse_special, std::vector<std::int32_t>& out) const;
};

namespace {

// note: the id space is allocated densely (bytes and flags per id); real vocabularies stay below
// 300,000 ids, so a file asking for more than 2^24 is malformed, not large.
constexpr std::int32_t k_max_token_id = 1 << 24;

[[noreturn]] void fail(const std::string& origin, const std::string& field, const std::string& what) {
  throw TokenizerError(origin + ": " + field + ": " + what);
}

const json& field(const json& obj, const char* key, const std::string& origin, const std::string& path) {
  if (!obj.is_object()) fail(origin, path, "expected an object, got " + std::string(obj.type_name()));
  const auto it = obj.find(key);
  if (it == obj.end()) fail(origin, path + "." + key, "missing");
  return *it;
}

bool flag(const json& obj, const char* key, bool fallback, const std::string& origin, const std::string& path) {
  const auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) fail(origin, path + "." + key, "expected a boolean, got " + it->dump());
  return it->get<bool>();
}

// Raw bytes the ByteLevel decoder produces for a token string: each code point mapped back to its
// byte when the whole string is in the byte-level alphabet, else the string's own UTF-8 bytes (the
// rule of Hugging Face tokenizers' ByteLevel decode_chain, which added tokens also go through).
std::string decoded_bytes(const std::string& token) {
  auto bytes = byte_level::to_bytes(token);
  return bytes ? std::move(*bytes) : token;
}

struct BpeSink final : WordSink {
  const BpeModel& bpe;
  std::vector<std::int32_t>& out;
  BpeSink(const BpeModel& b, std::vector<std::int32_t>& o) : bpe(b), out(o) {}
  void word(std::string_view w) override { bpe.encode_word(w, out); }
};

}  // namespace

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

Tokenizer Tokenizer::from_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw TokenizerError(path + ": cannot open tokenizer file");
  std::ostringstream ss;
  ss << in.rdbuf();
  return from_json_text(ss.str(), path);
}

Tokenizer Tokenizer::from_json_text(std::string_view text, std::string_view origin_view) {
  const std::string origin(origin_view);
  TokenizerJson doc = parse_tokenizer_json(text, origin);
  const json& root = doc.rest;
  if (!root.is_object()) fail(origin, "(root)", "expected an object, got " + std::string(root.type_name()));
  auto impl = std::make_unique<Impl>();
  impl->origin = origin;

  // --- model ---
  const json& model = field(root, "model", origin, "(root)");
  if (!model.is_object()) fail(origin, "model", "expected an object, got " + std::string(model.type_name()));
  if (model.contains("type") && model.at("type") != "BPE")
    fail(origin, "model.type", "unsupported model " + model.at("type").dump() + " (supported: BPE)");
  if (model.contains("dropout") && !model.at("dropout").is_null())
    fail(origin, "model.dropout", "BPE dropout is not supported (got " + model.at("dropout").dump() + ")");
  if (flag(model, "byte_fallback", false, origin, "model"))
    fail(origin, "model.byte_fallback", "byte_fallback is not supported (byte-level BPE never needs it)");
  for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (model.contains(k) && model.at(k).is_string() && !model.at(k).get<std::string>().empty())
      fail(origin, std::string("model.") + k, "not supported (got " + model.at(k).dump() + ")");
  }
  const bool ignore_merges = flag(model, "ignore_merges", false, origin, "model");
  if (!doc.has_vocab) fail(origin, "model.vocab", "missing");
  if (!doc.has_merges) fail(origin, "model.merges", "missing");

  std::unordered_map<std::string_view, std::int32_t> by_form;  // byte-level form -> id
  by_form.reserve(doc.vocab.size());
  std::int32_t max_id = -1;
  for (const auto& [form, id] : doc.vocab) {
    if (id >= k_max_token_id)
      fail(origin, "model.vocab[\"" + form + "\"]", "id " + std::to_string(id) + " exceeds the supported maximum " + std::to_string(k_max_token_id - 1));
    by_form[form] = id;
    max_id = std::max(max_id, id);
  }
  const json& added = root.contains("added_tokens") && !root.at("added_tokens").is_null() ? root.at("added_tokens") : json::array();
  if (!added.is_array()) fail(origin, "added_tokens", "expected an array");
  for (std::size_t i = 0; i < added.size(); ++i) {
    const json& id = field(added[i], "id", origin, "added_tokens[" + std::to_string(i) + "]");
    if (!id.is_number_integer() || id.get<std::int64_t>() < 0 || id.get<std::int64_t>() >= k_max_token_id)
      fail(origin, "added_tokens[" + std::to_string(i) + "].id", "expected an integer in [0, " + std::to_string(k_max_token_id) + "), got " + id.dump());
    max_id = std::max(max_id, id.get<std::int32_t>());
  }
  const auto n_ids = static_cast<std::size_t>(max_id + 1);
  impl->id_bytes.assign(n_ids, std::string());
  impl->special.assign(n_ids, 0);
  impl->vocab.reserve(doc.vocab.size());
  for (const auto& [form, id] : doc.vocab) {
    auto bytes = byte_level::to_bytes(form);
    if (bytes) impl->vocab.emplace(*bytes, id);
    impl->id_bytes[static_cast<std::size_t>(id)] = bytes ? std::move(*bytes) : form;
  }

  std::array<std::int32_t, 256> byte_ids{};
  for (unsigned b = 0; b < 256; ++b) {
    std::string form;
    utf8::append(form, byte_level::char_of_byte(static_cast<unsigned char>(b)));
    const auto it = by_form.find(form);
    if (it == by_form.end()) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "0x%02X", b);
      fail(origin, "model.vocab", std::string("no token for byte ") + hex + " ('" + form + "'): not a byte-level BPE vocabulary");
    }
    byte_ids[b] = it->second;
  }

  MergeTable table(doc.merges.size());
  std::string joined;
  for (std::size_t i = 0; i < doc.merges.size(); ++i) {
    const std::string_view a = doc.merges[i].first, b = doc.merges[i].second;
    const std::string where = "model.merges[" + std::to_string(i) + "]";
    joined.assign(a);
    joined.append(b);
    const auto ia = by_form.find(a), ib = by_form.find(b), ij = by_form.find(joined);
    if (ia == by_form.end()) fail(origin, where, "left token '" + std::string(a) + "' is not in model.vocab");
    if (ib == by_form.end()) fail(origin, where, "right token '" + std::string(b) + "' is not in model.vocab");
    if (ij == by_form.end()) fail(origin, where, "merged token '" + joined + "' is not in model.vocab");
    table.insert_or_assign(ia->second, ib->second, {static_cast<std::int32_t>(i), ij->second});
  }

  // --- normaliser and pre-tokenizer ---
  impl->normalizer = Normalizer(root.contains("normalizer") ? root.at("normalizer") : json(), origin);
  impl->pre_tokenizer = std::make_unique<PreTokenizer>(root.contains("pre_tokenizer") ? root.at("pre_tokenizer") : json(), origin);
  if (root.contains("decoder") && !root.at("decoder").is_null()) {
    const json& dec = root.at("decoder");
    const std::string type = dec.is_object() && dec.contains("type") ? dec.at("type").dump() : dec.dump();
    if (type != "\"ByteLevel\"") fail(origin, "decoder.type", "unsupported decoder " + type + " (supported: ByteLevel)");
  }

  // --- added tokens ---
  for (std::size_t i = 0; i < added.size(); ++i) {
    const json& t = added[i];
    const std::string where = "added_tokens[" + std::to_string(i) + "]";
    const json& content = field(t, "content", origin, where);
    if (!content.is_string() || content.get_ref<const std::string&>().empty())
      fail(origin, where + ".content", "expected a non-empty string, got " + content.dump());
    AddedToken tok;
    tok.content = content.get<std::string>();
    if (!utf8::is_valid(tok.content)) fail(origin, where + ".content", "not valid UTF-8");
    tok.id = t.at("id").get<std::int32_t>();
    tok.special = flag(t, "special", false, origin, where);
    tok.lstrip = flag(t, "lstrip", false, origin, where);
    tok.rstrip = flag(t, "rstrip", false, origin, where);
    tok.single_word = flag(t, "single_word", false, origin, where);
    tok.normalized = flag(t, "normalized", !tok.special, origin, where);
    const auto uid = static_cast<std::size_t>(tok.id);
    impl->id_bytes[uid] = decoded_bytes(tok.content);
    impl->special[uid] = tok.special ? 1 : 0;
    impl->added[tok.content] = tok.id;
    if (tok.normalized) {
      tok.content = impl->normalizer.apply(tok.content);
      impl->normalized_matcher.add(tok);
    } else {
      impl->raw_matcher.add(tok);
    }
  }
  impl->bpe = std::make_unique<BpeModel>(byte_ids, std::move(table), &impl->vocab, ignore_merges);
  return Tokenizer(std::move(impl));
}

void Tokenizer::Impl::encode_section(std::string_view text, bool parse_special, std::vector<std::int32_t>& out) const {
  std::string normalized_storage;
  const std::string_view normalized = normalizer.apply_view(text, normalized_storage);
  BpeSink sink(*bpe, out);
  if (normalized_matcher.empty()) {
    pre_tokenizer->split(normalized, sink);
    return;
  }
  std::vector<AddedSegment> segments;
  normalized_matcher.split(normalized, parse_special, segments);
  for (const AddedSegment& s : segments) {
    if (s.id >= 0) {
      out.push_back(s.id);
    } else {
      pre_tokenizer->split(normalized.substr(s.begin, s.end - s.begin), sink);
    }
  }
}

void Tokenizer::Impl::encode_valid(std::string_view text, bool parse_special, std::vector<std::int32_t>& out) const {
  if (raw_matcher.empty()) {
    encode_section(text, parse_special, out);
    return;
  }
  std::vector<AddedSegment> segments;
  raw_matcher.split(text, parse_special, segments);
  for (const AddedSegment& s : segments) {
    if (s.id >= 0) {
      out.push_back(s.id);
    } else {
      encode_section(text.substr(s.begin, s.end - s.begin), parse_special, out);
    }
  }
}

std::vector<std::int32_t> Tokenizer::encode(std::string_view text, bool parse_special) const {
  std::vector<std::int32_t> out;
  out.reserve(text.size() / 3 + 4);
  // note: the reference only sees valid text; invalid bytes here split the text into valid runs,
  // and each invalid byte becomes its single-byte token (every byte has one in byte-level BPE).
  std::size_t i = 0;
  while (i < text.size()) {
    std::size_t j = i;
    while (j < text.size()) {
      if (static_cast<unsigned char>(text[j]) < 0x80) {
        ++j;
        continue;
      }
      const std::size_t n = utf8::valid_sequence_length(text, j);
      if (n == 0) break;
      j += n;
    }
    if (j > i) impl_->encode_valid(text.substr(i, j - i), parse_special, out);
    if (j < text.size()) {
      impl_->bpe->encode_word(text.substr(j, 1), out);
      ++j;
    }
    i = j;
  }
  return out;
}

std::string Tokenizer::token_bytes(std::int32_t id) const {
  if (id < 0 || static_cast<std::size_t>(id) >= impl_->id_bytes.size())
    throw TokenizerError(impl_->origin + ": token id " + std::to_string(id) + " is out of range (vocabulary size " +
                         std::to_string(impl_->id_bytes.size()) + ")");
  return impl_->id_bytes[static_cast<std::size_t>(id)];
}

std::string Tokenizer::decode(std::span<const std::int32_t> ids, bool skip_special) const {
  std::string bytes;
  for (const std::int32_t id : ids) {
    if (id < 0 || static_cast<std::size_t>(id) >= impl_->id_bytes.size())
      throw TokenizerError(impl_->origin + ": token id " + std::to_string(id) + " is out of range (vocabulary size " +
                           std::to_string(impl_->id_bytes.size()) + ")");
    if (skip_special && impl_->special[static_cast<std::size_t>(id)]) continue;
    bytes += impl_->id_bytes[static_cast<std::size_t>(id)];
  }
  std::string out;
  out.reserve(bytes.size());
  utf8::append_lossy(out, bytes);
  return out;
}

std::optional<std::int32_t> Tokenizer::token_id(std::string_view token) const {
  if (const auto it = impl_->added.find(std::string(token)); it != impl_->added.end()) return it->second;
  const auto bytes = byte_level::to_bytes(token);
  if (!bytes) return std::nullopt;
  if (const auto it = impl_->vocab.find(*bytes); it != impl_->vocab.end()) return it->second;
  return std::nullopt;
}

std::size_t Tokenizer::vocab_size() const { return impl_->id_bytes.size(); }

bool Tokenizer::is_special(std::int32_t id) const {
  return id >= 0 && static_cast<std::size_t>(id) < impl_->special.size() && impl_->special[static_cast<std::size_t>(id)] != 0;
}

// --- StreamDecoder ---

StreamDecoder::StreamDecoder(const Tokenizer& tok, bool skip_special) : tok_(&tok), skip_special_(skip_special) {}

std::string StreamDecoder::push(std::int32_t id) {
  if (skip_special_ && tok_->is_special(id)) return {};
  pending_ += tok_->token_bytes(id);
  std::string out;
  const std::size_t held = utf8::append_lossy(out, pending_, /*hold_truncated_tail=*/true);
  pending_.erase(0, pending_.size() - held);
  return out;
}

std::string StreamDecoder::flush() {
  std::string out;
  utf8::append_lossy(out, pending_);
  pending_.clear();
  return out;
}

}  // namespace servedeck::worker
