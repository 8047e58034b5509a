// write_model's planted reply (worker/model/tiny_model.hpp PlantedReply): the lm_head rows it
// writes, the untied config it forces, and the errors for options that cannot plant a reply.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

#include "tests/worker/model/temp_dir.hpp"
#include "worker/model/safetensors.hpp"
#include "worker/model/tiny_model.hpp"

using namespace servedeck::worker;

namespace {

TinyModelOptions small_planted() {
  TinyModelOptions o;
  o.vocab_size = 1000;
  o.max_position_embeddings = 128;
  o.residual_scale = 0.05;
  o.planted_reply.after = {7, 8};
  o.planted_reply.tokens = {100, 200, 300};
  o.planted_reply.end_token = 999;
  return o;
}

float bf16(const std::byte* p) {
  const std::uint32_t bits = (static_cast<std::uint32_t>(p[1]) << 24) | (static_cast<std::uint32_t>(p[0]) << 16);
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

/// Row `r` of a [vocab, h] BF16 tensor.
std::vector<float> row(const TensorRef& t, std::int64_t r) {
  const auto h = t.info->shape[1];
  std::vector<float> out(static_cast<std::size_t>(h));
  for (std::int64_t k = 0; k < h; ++k) out[static_cast<std::size_t>(k)] = bf16(t.bytes.data() + 2 * (r * h + k));
  return out;
}

std::string write_error(const TinyModelOptions& o) {
  servedeck::test::TempDir dir;
  try {
    write_model(dir.path(), o);
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("a planted reply: each reply row is gain x the embedding of the token before it") {
  servedeck::test::TempDir dir;
  const auto o = small_planted();
  write_model(dir.path(), o);
  const auto set = TensorSet::open_dir(dir.path());
  const auto embed = set.find("model.embed_tokens.weight");
  const auto head = set.find("lm_head.weight");
  REQUIRE(embed.info != nullptr);
  REQUIRE(head.info != nullptr);  // untied even though tie_word_embeddings defaults to true
  CHECK(head.info->shape == std::vector<std::int64_t>{1000, 64});

  auto expect_row = [&](std::int64_t r, std::vector<std::int64_t> from) {
    const auto got = row(head, r);
    std::vector<float> want(got.size(), 0.0F);
    for (auto f : from) {
      const auto e = row(embed, f);
      for (std::size_t k = 0; k < e.size(); ++k) want[k] += 2.0F * e[k];
    }
    for (std::size_t k = 0; k < got.size(); ++k)
      CHECK_MESSAGE(std::fabs(got[k] - want[k]) <= 0.01F * std::fabs(want[k]) + 1e-6F, "row " << r << " dim " << k);
  };
  expect_row(100, {7, 8});
  expect_row(200, {100});
  expect_row(300, {200});
  expect_row(999, {300});

  // An unplanted row stays random: not a multiple of its own embedding.
  const auto r5 = row(head, 5), e5 = row(embed, 5);
  double dot = 0, n1 = 0, n2 = 0;
  for (std::size_t k = 0; k < r5.size(); ++k) {
    dot += r5[k] * e5[k];
    n1 += r5[k] * r5[k];
    n2 += e5[k] * e5[k];
  }
  CHECK(std::fabs(dot / std::sqrt(n1 * n2)) < 0.6);

  std::ifstream cfg(dir / "config.json");
  const auto c = nlohmann::json::parse(cfg);
  CHECK(c["tie_word_embeddings"] == false);
}

TEST_CASE("a planted reply that cannot be planted is refused with the offending id") {
  auto o = small_planted();
  o.planted_reply.tokens = {100, 200, 100};
  CHECK(write_error(o).find("token id 100 appears twice") != std::string::npos);

  o = small_planted();
  o.planted_reply.tokens = {100, 8};
  CHECK(write_error(o).find("token id 8 is both a start and in the reply") != std::string::npos);

  o = small_planted();
  o.planted_reply.end_token = 1000;
  CHECK(write_error(o).find("end id 1000 is outside the vocabulary [0, 1000)") != std::string::npos);

  o = small_planted();
  o.planted_reply.end_token = 200;
  CHECK(write_error(o).find("the end token 200 is also in the reply") != std::string::npos);

  o = small_planted();
  o.planted_reply.end_token = 7;
  CHECK(write_error(o).find("the end token 7 is also a start token") != std::string::npos);

  o = small_planted();
  o.planted_reply.after.clear();
  CHECK(write_error(o).find("no start token") != std::string::npos);

  o = small_planted();
  o.residual_scale = 0.0;
  CHECK(write_error(o).find("residual_scale") != std::string::npos);
}

TEST_CASE("a planted switch that cannot be planted is refused, naming the token") {
  auto o = small_planted();
  o.planted_switch.marker = 50;
  o.planted_switch.tokens = {400, o.planted_reply.tokens[0]};
  CHECK(write_error(o).find("token id " + std::to_string(o.planted_reply.tokens[0])) != std::string::npos);

  o = small_planted();
  o.planted_switch.marker = 5000;
  o.planted_switch.tokens = {400, 401};
  CHECK(write_error(o).find("marker id 5000 is outside the vocabulary") != std::string::npos);

  o = small_planted();
  o.planted_reply.tokens.clear();
  o.planted_switch.marker = 50;
  o.planted_switch.tokens = {400, 401};
  CHECK(write_error(o).find("a planted switch needs a planted reply") != std::string::npos);
}
