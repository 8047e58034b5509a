// Unit tests of the tokenizer's parts: UTF-8 helpers, NFC, the byte-level alphabet, the two BPE merge
// algorithms, added-token rules, load errors and invalid UTF-8 input.
#include <doctest/doctest.h>

#include <random>

#include <nlohmann/json.hpp>

#include "tests/worker/tokenizer/test_support.hpp"
#include "worker/tokenizer/bpe.hpp"
#include "worker/tokenizer/byte_level.hpp"
#include "worker/tokenizer/pre_tokenizer.hpp"
#include "worker/tokenizer/tokenizer.hpp"
#include "worker/tokenizer/unicode_nfc.hpp"
#include "worker/tokenizer/utf8.hpp"

using namespace servedeck::worker;
using nlohmann::json;

namespace {

// A tiny byte-level tokenizer.json: the 256 byte tokens (ids 0..255) plus merges given as pairs of
// byte-level strings; merged tokens get the next ids.
json tiny_tokenizer(const std::vector<std::pair<std::string, std::string>>& merges, bool pair_form = false) {
  json vocab = json::object();
  for (unsigned b = 0; b < 256; ++b) {
    std::string s;
    utf8::append(s, byte_level::char_of_byte(static_cast<unsigned char>(b)));
    vocab[s] = b;
  }
  json m = json::array();
  int next = 256;
  for (const auto& [a, b] : merges) {
    if (!vocab.contains(a + b)) vocab[a + b] = next++;
    if (pair_form) {
      m.push_back(json::array({a, b}));
    } else {
      m.push_back(a + " " + b);
    }
  }
  return json{{"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", m}}},
              {"normalizer", nullptr},
              {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
              {"decoder", {{"type", "ByteLevel"}}},
              {"added_tokens", json::array()}};
}

std::string error_of(const std::string& text) {
  try {
    (void)Tokenizer::from_json_text(text, "unit.json");
  } catch (const TokenizerError& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST_CASE("utf8: lossy conversion replaces maximal invalid subparts") {
  std::string out;
  utf8::append_lossy(out, std::string("a\xE2\x82" "b\xFF\xC0\x80" "c", 8));
  CHECK(out == "a\xEF\xBF\xBD" "b\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD" "c");
  out.clear();
  CHECK(utf8::append_lossy(out, "x\xF0\x9F\x98", true) == 3);
  CHECK(out == "x");
  CHECK(utf8::is_valid("\xED\x9F\xBF"));
  CHECK_FALSE(utf8::is_valid("\xED\xA0\x80"));  // surrogate
  CHECK_FALSE(utf8::is_valid("\xF4\x90\x80\x80"));  // > U+10FFFF
}

TEST_CASE("nfc: composition, Hangul, singletons and canonical order") {
  CHECK(nfc_normalize("e\xCC\x81") == "\xC3\xA9");                                  // e + U+0301 -> é
  CHECK(nfc_normalize("\xE1\x84\x80\xE1\x85\xA1\xE1\x86\xA8") == "\xEA\xB0\x81");  // ᄀ ᅡ ᆨ -> 각
  CHECK(nfc_normalize("\xE2\x84\xAB") == "\xC3\x85");                               // U+212B -> U+00C5
  // a + dot above (230) + dot below (220) -> ạ̇ : reordered, then a+dot below composes to U+1EA1
  CHECK(nfc_normalize("a\xCC\x87\xCC\xA3") == "\xE1\xBA\xA1\xCC\x87");
  CHECK(nfc_normalize("plain ascii") == "plain ascii");
  CHECK(nfc_quick_check("中文 emoji 😀"));
  CHECK_FALSE(nfc_quick_check("e\xCC\x81"));
  CHECK(std::string(nfc_unicode_version()) == "14.0.0");
}

TEST_CASE("byte-level alphabet round-trips all 256 bytes") {
  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));
  const auto back = byte_level::to_bytes(byte_level::from_bytes(all));
  REQUIRE(back.has_value());
  CHECK(*back == all);
  CHECK(byte_level::char_of_byte(' ') == U'\u0120');
  CHECK(byte_level::char_of_byte('\n') == U'\u010A');
  CHECK_FALSE(byte_level::to_bytes("\xE2\x96\x81").has_value());  // U+2581 is not in the alphabet
}

TEST_CASE("bpe: short-word and heap algorithms agree") {
  // Merges over a 4-letter alphabet, with ties and chains, ranks in list order.
  const std::vector<std::pair<std::string, std::string>> merges = {
      {"a", "b"}, {"b", "a"}, {"ab", "a"}, {"a", "a"}, {"c", "d"}, {"ab", "ab"}, {"aa", "b"}, {"d", "c"},
      {"cd", "cd"}, {"ba", "b"}, {"abab", "a"}, {"a", "c"}, {"ac", "d"}};
  const Tokenizer tok = Tokenizer::from_json_text(tiny_tokenizer(merges).dump());
  std::array<int32_t, 256> byte_ids{};
  for (int b = 0; b < 256; ++b) byte_ids[static_cast<std::size_t>(b)] = b;
  MergeTable table;
  int32_t rank = 0;
  for (const auto& [a, b] : merges) {
    table.insert_or_assign(*tok.token_id(a), *tok.token_id(b), {rank++, *tok.token_id(a + b)});
  }
  const BpeModel bpe(byte_ids, std::move(table), nullptr, false);
  std::mt19937 rng(1234);
  for (int iter = 0; iter < 3000; ++iter) {
    std::string word(1 + rng() % 40, 'a');
    for (auto& c : word) c = "abcd"[rng() % 4];
    std::vector<int32_t> a, b;
    bpe.merge_word_short(word, a);
    bpe.merge_word_heap(word, b);
    REQUIRE_MESSAGE(a == b, "word " << word);
    std::string joined;
    for (const int32_t id : a) joined += tok.token_bytes(id);
    REQUIRE(joined == word);
  }
  // Leftmost wins among equal ranks: "aaa" -> "aa" "a".
  std::vector<int32_t> ids;
  bpe.merge_word("aaa", ids);
  CHECK(ids == std::vector<int32_t>{*tok.token_id("aa"), 'a'});
}

TEST_CASE("merges in [a, b] pair form load like the string form") {
  const std::vector<std::pair<std::string, std::string>> merges = {{"h", "e"}, {"l", "l"}, {"he", "ll"}, {"Ġ", "w"}};
  const Tokenizer a = Tokenizer::from_json_text(tiny_tokenizer(merges, false).dump());
  const Tokenizer b = Tokenizer::from_json_text(tiny_tokenizer(merges, true).dump());
  CHECK(a.encode("hello world") == b.encode("hello world"));
  CHECK(a.encode("hello world") == std::vector<int32_t>{*a.token_id("hell"), 'o', *a.token_id("Ġw"), 'o', 'r', 'l', 'd'});
}

TEST_CASE("added tokens: special, lstrip/rstrip, single_word, parse_special") {
  json cfg = tiny_tokenizer({});
  cfg["added_tokens"] = json::array({
      {{"id", 300}, {"content", "<s>"}, {"special", true}, {"normalized", false}},
      {{"id", 301}, {"content", "<pad>"}, {"special", false}, {"lstrip", true}, {"rstrip", true}, {"normalized", false}},
      {{"id", 302}, {"content", "cat"}, {"special", false}, {"single_word", true}, {"normalized", false}},
      {{"id", 303}, {"content", "<s>x"}, {"special", true}, {"normalized", false}},
  });
  const Tokenizer tok = Tokenizer::from_json_text(cfg.dump());
  CHECK(tok.vocab_size() == 304);
  CHECK(tok.is_special(300));
  CHECK_FALSE(tok.is_special(301));
  CHECK(tok.encode("<s>") == std::vector<int32_t>{300});
  CHECK(tok.encode("<s>x") == std::vector<int32_t>{303});  // longest match
  CHECK(tok.encode("<s>", false) == std::vector<int32_t>{'<', 's', '>'});
  CHECK(tok.encode("a  <pad>  b") == std::vector<int32_t>{'a', 301, 'b'});
  CHECK(tok.encode("a cat b") == std::vector<int32_t>{'a', ' ', 302, ' ', 'b'});
  CHECK(tok.encode("concatenate").size() == 11);  // inside a word: not matched
  CHECK(tok.decode(tok.encode("x<s>y")) == "x<s>y");
  CHECK(tok.decode(tok.encode("x<s>y"), true) == "xy");
  CHECK(tok.token_id("<pad>") == 301);
}

TEST_CASE("invalid UTF-8 is encoded byte-wise without a crash") {
  const Tokenizer tok = Tokenizer::from_json_text(tiny_tokenizer({{"a", "b"}}).dump());
  const std::string bad("ab\xFF\xC3(ab\xE2\x82", 9);
  const auto ids = tok.encode(bad);
  CHECK(ids == std::vector<int32_t>{256, 0xFF, 0xC3, '(', 256, 0xE2, 0x82});
  CHECK(tok.decode(ids) == "ab\xEF\xBF\xBD\xEF\xBF\xBD(ab\xEF\xBF\xBD");
  CHECK_THROWS_AS((void)tok.decode(std::vector<int32_t>{5000}), TokenizerError);
}

TEST_CASE("load errors name the file and the field") {
  CHECK(error_of("{") .find("unit.json: not valid JSON") != std::string::npos);
  CHECK(error_of("{}").find("unit.json: (root).model: missing") != std::string::npos);
  json cfg = tiny_tokenizer({{"a", "b"}});
  cfg["model"]["merges"][0] = "a b c";
  CHECK(error_of(cfg.dump()).find("model.merges[0]") != std::string::npos);
  cfg = tiny_tokenizer({{"a", "b"}});
  cfg["model"]["merges"][0] = "a zz";
  CHECK(error_of(cfg.dump()).find("model.merges[0]: right token 'zz' is not in model.vocab") != std::string::npos);
  cfg = tiny_tokenizer({});
  cfg["normalizer"] = {{"type", "NFKC"}};
  CHECK(error_of(cfg.dump()).find("normalizer.type: unsupported normalizer \"NFKC\"") != std::string::npos);
  cfg = tiny_tokenizer({});
  cfg["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "(unclosed"}}}, {"behavior", "Isolated"}};
  CHECK(error_of(cfg.dump()).find("pre_tokenizer.pattern.Regex: cannot compile regex") != std::string::npos);
  cfg = tiny_tokenizer({});
  cfg["model"]["vocab"].erase("Ġ");
  CHECK(error_of(cfg.dump()).find("model.vocab: no token for byte 0x20") != std::string::npos);
  cfg = tiny_tokenizer({});
  cfg["added_tokens"] = json::array({{{"id", "x"}, {"content", "<s>"}}});
  CHECK(error_of(cfg.dump()).find("added_tokens[0].id: expected an integer in [0, 16777216), got \"x\"") != std::string::npos);
  cfg = tiny_tokenizer({});
  cfg["model"]["vocab"]["big"] = 2147483647;
  CHECK(error_of(cfg.dump()).find("model.vocab[\"big\"]: id 2147483647 exceeds the supported maximum 16777215") != std::string::npos);
  cfg = tiny_tokenizer({});
  cfg["model"]["vocab"]["zz"] = "7";
  CHECK(error_of(cfg.dump()).find("model.vocab[\"zz\"]: expected a non-negative integer id, got \"7\"") != std::string::npos);
  cfg = tiny_tokenizer({});
  cfg["model"]["merges"] = json::array({json::array({"a"})});
  CHECK(error_of(cfg.dump()).find("model.merges[0]: expected [left, right], got 1 strings") != std::string::npos);
  cfg = tiny_tokenizer({});
  cfg["model"]["merges"] = nullptr;
  CHECK(error_of(cfg.dump()).find("model.merges: expected an array, got null") != std::string::npos);
  cfg = tiny_tokenizer({});
  cfg["model"].erase("merges");
  CHECK(error_of(cfg.dump()).find("unit.json: model.merges: missing") != std::string::npos);
  CHECK_THROWS_WITH_AS(Tokenizer::from_file("/nonexistent/tokenizer.json"),
                       doctest::Contains("/nonexistent/tokenizer.json: cannot open"), TokenizerError);
}

TEST_CASE("split behaviors follow the reference's definitions") {
  struct Collect final : WordSink {
    std::vector<std::string> words;
    void word(std::string_view w) override { words.emplace_back(w); }
  };
  auto split = [](const char* behavior, bool invert, std::string_view text) {
    const PreTokenizer pt(json{{"type", "Split"}, {"pattern", {{"String", "-"}}}, {"behavior", behavior}, {"invert", invert}}, "t");
    Collect c;
    pt.split(text, c);
    return c.words;
  };
  using V = std::vector<std::string>;
  CHECK(split("Isolated", false, "a-b--c") == V{"a", "-", "b", "-", "-", "c"});
  CHECK(split("Removed", false, "a-b--c") == V{"a", "b", "c"});
  CHECK(split("MergedWithPrevious", false, "a-b--c") == V{"a-", "b-", "-", "c"});
  CHECK(split("MergedWithNext", false, "a-b--c") == V{"a", "-b", "-", "-c"});
  CHECK(split("Contiguous", false, "a-b--c") == V{"a", "-", "b", "--", "c"});
  CHECK(split("Removed", true, "a-b--c") == V{"-", "-", "-"});
}

TEST_CASE("whitespace classes follow Unicode White_Space, as the reference's regex engine does") {
  // U+0085 (NEL) is White_Space (JS \s misses it); U+FEFF is not (JS \s includes it); U+180E is
  // not (PCRE2's own \s includes it).
  CHECK(translate_whitespace_classes("\\s+(?!\\S)").find("\\x{85}") != std::string::npos);
  const Tokenizer tok = Tokenizer::from_file(servedeck::worker::test::reference_tokenizer_json("qwen3"));
  // "a" + NEL + NEL + "b": with NEL as whitespace the pre-tokenizer yields "a", NEL, NEL+"b"?? no:
  // `\s+(?!\S)` takes the first NEL, then `[^\r\n\p{L}\p{N}]?\p{L}+` takes NEL+"b".
  const std::string nel = "\xC2\x85";
  const auto ids = tok.encode("a" + nel + nel + "b");
  std::vector<std::string> pieces;
  for (const int32_t id : ids) pieces.push_back(tok.token_bytes(id));
  std::string joined;
  for (const auto& p : pieces) joined += p;
  CHECK(joined == "a" + nel + nel + "b");
  // The last piece carries "b" glued to a NEL byte sequence, never a lone "b" after "\x85\xC2".
  CHECK(pieces.back().back() == 'b');
}
