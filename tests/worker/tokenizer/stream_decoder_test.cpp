// StreamDecoder: fed token by token it never emits a partial UTF-8 sequence and its pieces add up
// to decode(all ids). Also: concurrent encode() (the Tokenizer's thread-safety contract).
#include <doctest/doctest.h>

#include <atomic>
#include <random>
#include <thread>

#include "tests/worker/tokenizer/test_support.hpp"
#include "worker/tokenizer/tokenizer.hpp"
#include "worker/tokenizer/utf8.hpp"

using namespace servedeck::worker;

namespace {

const Tokenizer& qwen3() {
  static const Tokenizer tok = Tokenizer::from_file(test::reference_tokenizer_json("qwen3"));
  return tok;
}

std::string stream(const Tokenizer& tok, const std::vector<int32_t>& ids, bool skip_special = false) {
  StreamDecoder dec(tok, skip_special);
  std::string all;
  for (const int32_t id : ids) {
    const std::string piece = dec.push(id);
    REQUIRE_MESSAGE(utf8::is_valid(piece), "piece after id " << id << " is not valid UTF-8");
    all += piece;
  }
  const std::string tail = dec.flush();
  REQUIRE(utf8::is_valid(tail));
  return all + tail;
}

}  // namespace

TEST_CASE("stream decoding of text whose characters are split across tokens") {
  const Tokenizer& tok = qwen3();
  const std::string text = "Emoji 👩‍💻👨‍👩‍👧‍👦🇯🇵 and rare CJK 𠀀𪚥龘 plus Ω≈ç√∫ and <|im_end|> done";
  const auto ids = tok.encode(text);
  // The test must exercise the hold-back path: some token alone is not valid UTF-8.
  bool some_partial = false;
  for (const int32_t id : ids) some_partial |= !utf8::is_valid(tok.token_bytes(id));
  REQUIRE(some_partial);
  CHECK(stream(tok, ids) == tok.decode(ids));
  CHECK(stream(tok, ids) == text);
  CHECK(stream(tok, ids, true) == tok.decode(ids, true));
}

TEST_CASE("stream decoding of arbitrary id sequences equals decode") {
  const Tokenizer& tok = qwen3();
  std::mt19937 rng(42);
  // Byte-level ids of single bytes 0x80..0xFF make invalid and truncated sequences likely.
  std::vector<int32_t> byte_tokens;
  for (int b = 0x80; b < 0x100; ++b) {
    std::string s(1, static_cast<char>(b));
    const auto ids = tok.encode(s);
    REQUIRE(ids.size() == 1);
    byte_tokens.push_back(ids[0]);
  }
  for (int iter = 0; iter < 300; ++iter) {
    std::vector<int32_t> ids(1 + rng() % 30);
    for (auto& id : ids) {
      id = (rng() % 3 == 0) ? static_cast<int32_t>(rng() % tok.vocab_size()) : byte_tokens[rng() % byte_tokens.size()];
    }
    CHECK(stream(tok, ids) == tok.decode(ids));
  }
}

TEST_CASE("flush emits held bytes as U+FFFD") {
  const Tokenizer& tok = qwen3();
  const auto ids = tok.encode("\xF0\x9F\x98");  // truncated emoji: byte tokens
  StreamDecoder dec(tok);
  std::string out;
  for (const int32_t id : ids) out += dec.push(id);
  CHECK(out.empty());
  CHECK(dec.flush() == "\xEF\xBF\xBD");
  CHECK(dec.flush().empty());
}

TEST_CASE("concurrent encode from several threads equals sequential encode") {
  // The header promises encode() may run concurrently; the word cache is the shared state.
  const Tokenizer& tok = qwen3();
  const auto corpus = test::load_corpus();
  std::vector<std::vector<int32_t>> expected;
  for (const auto& [name, text] : corpus) expected.push_back(tok.encode(text));
  std::atomic<int> mismatches{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 3; ++round)
        for (std::size_t i = 0; i < corpus.size(); ++i) {
          const std::size_t k = (i + static_cast<std::size_t>(t) * 7) % corpus.size();
          if (tok.encode(corpus[k].second) != expected[k]) ++mismatches;
        }
    });
  }
  for (auto& th : threads) th.join();
  CHECK(mismatches.load() == 0);
}
