#include "worker/model/glm_fixture_tokenizer.hpp"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>

namespace servedeck::worker {

namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read '" + p.string() + "' (expected Qwen3's tokenizer files there)");
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

void write_text(const fs::path& p, const std::string& text) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out << text;
  if (!out) throw std::runtime_error("cannot write '" + p.string() + "'");
}

/// Markup the parsers read: decoded even when a request skips special tokens, as GLM-4.5's
/// tokenizer_config.json marks them (special: false).
bool is_markup(std::string_view t) {
  return t == "<think>" || t == "</think>" || t == "<tool_call>" || t == "</tool_call>" || t == "<tool_response>" ||
         t == "</tool_response>" || t == "<arg_key>" || t == "</arg_key>" || t == "<arg_value>" || t == "</arg_value>" ||
         t == "/nothink";
}

}  // namespace

void write_glm_fixture_tokenizer(const std::string& out_dir, const std::string& qwen3_tokenizer_dir) {
  const fs::path src = fs::path(qwen3_tokenizer_dir) / "tokenizer.json";
  json tok = json::parse(read_text(src), nullptr, false);
  if (tok.is_discarded() || !tok.is_object() || !tok.contains("model") || !tok["model"].contains("vocab") ||
      !tok["model"]["vocab"].is_object() || !tok["model"].contains("merges") || !tok["model"]["merges"].is_array())
    throw std::runtime_error("'" + src.string() + "': expected a BPE tokenizer.json with model.vocab and model.merges");

  // Regular tokens: Qwen3's below GLM's first special id.
  json vocab = json::object();
  for (const auto& [piece, id] : tok["model"]["vocab"].items())
    if (id.is_number_integer() && id.get<std::int64_t>() < k_glm_first_special_id) vocab[piece] = id;
  // Merges whose parts and result all survive (merges are "a b" strings or [a, b] pairs).
  json merges = json::array();
  for (const auto& m : tok["model"]["merges"]) {
    std::string a, b;
    if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      a = m[0].get<std::string>();
      b = m[1].get<std::string>();
    } else if (m.is_string()) {
      const std::string s = m.get<std::string>();
      const auto sp = s.find(' ');
      if (sp == std::string::npos) continue;
      a = s.substr(0, sp);
      b = s.substr(sp + 1);
    } else {
      continue;
    }
    if (vocab.contains(a) && vocab.contains(b) && vocab.contains(a + b)) merges.push_back(json::array({a, b}));
  }
  tok["model"]["vocab"] = std::move(vocab);
  tok["model"]["merges"] = std::move(merges);

  json added = json::array();
  json decoder = json::object();
  std::int64_t id = k_glm_first_special_id;
  for (std::string_view t : k_glm_special_tokens) {
    const bool special = !is_markup(t);
    added.push_back(json{{"id", id}, {"content", std::string(t)}, {"single_word", false}, {"lstrip", false},
                         {"rstrip", false}, {"normalized", false}, {"special", special}});
    decoder[std::to_string(id)] = json{{"content", std::string(t)}, {"lstrip", false}, {"normalized", false},
                                       {"rstrip", false}, {"single_word", false}, {"special", special}};
    ++id;
  }
  tok["added_tokens"] = std::move(added);

  fs::create_directories(out_dir);
  write_text(fs::path(out_dir) / "tokenizer.json", tok.dump() + "\n");
  const json config = {
      {"added_tokens_decoder", decoder},
      {"clean_up_tokenization_spaces", false},
      {"do_lower_case", false},
      {"eos_token", "<|endoftext|>"},
      {"pad_token", "<|endoftext|>"},
      {"model_max_length", 128000},
      {"padding_side", "left"},
      {"remove_space", false},
      {"tokenizer_class", "PreTrainedTokenizerFast"},
      {"servedeck_fixture", "byte-level BPE derived from Qwen3's with GLM-4.5's special tokens at GLM-4.5's ids "
                            "(worker/model/glm_fixture_tokenizer.hpp); not GLM's tokenizer"},
  };
  write_text(fs::path(out_dir) / "tokenizer_config.json", config.dump(2) + "\n");
}

}  // namespace servedeck::worker
