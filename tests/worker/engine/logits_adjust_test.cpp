// LogitsAdjuster against its formulas (worker/engine/logits_adjust.hpp): logit_bias added,
// the repetition penalty over prompt and output tokens by sign, frequency and presence over the
// output's counts, in that order; ids outside the row ignored when pushed.
#include <doctest/doctest.h>

#include <vector>

#include "worker/engine/logits_adjust.hpp"

using namespace servedeck::worker;

TEST_CASE("the default LogitsAdjust changes nothing and is not active") {
  LogitsAdjust a;
  CHECK_FALSE(a.active());
  a.repetition_penalty = 1.0f;
  a.presence_penalty = 0.0f;
  CHECK_FALSE(a.active());
  LogitsAdjust b;
  b.bias = {{3, 0.0f}};
  CHECK(b.active());  // a bias entry asks for the row even when its value is 0
  LogitsAdjust c;
  c.frequency_penalty = -0.5f;
  CHECK(c.active());
}

TEST_CASE("logit_bias adds its value to its ids only") {
  LogitsAdjust a;
  a.bias = {{1, 5.0f}, {4, -100.0f}};
  LogitsAdjuster adj(a, std::vector<int32_t>{0, 1, 2}, 6);
  std::vector<float> row = {1, 2, 3, 4, 5, 6};
  adj.apply(row);
  CHECK(row == std::vector<float>{1, 7, 3, 4, -95, 6});
}

TEST_CASE("the repetition penalty divides positive and multiplies negative logits of prompt and output tokens") {
  LogitsAdjust a;
  a.repetition_penalty = 2.0f;
  const std::vector<int32_t> prompt = {0, 0, 2, 9, -3};  // duplicates once; ids outside the row ignored
  LogitsAdjuster adj(a, prompt, 6);
  std::vector<float> row = {4, 4, -4, 4, -4, 4};
  adj.apply(row);
  CHECK(row == std::vector<float>{2, 4, -8, 4, -4, 4});
  adj.push(4);
  adj.push(4);  // counted once by the repetition penalty: it is not cumulative
  adj.push(77);  // outside the row: not counted
  row = {4, 4, -4, 4, -4, 4};
  adj.apply(row);
  CHECK(row == std::vector<float>{2, 4, -8, 4, -8, 4});
}

TEST_CASE("frequency and presence penalties use the generated counts, not the prompt") {
  LogitsAdjust a;
  a.frequency_penalty = 0.5f;
  a.presence_penalty = 1.0f;
  LogitsAdjuster adj(a, std::vector<int32_t>{0, 1, 2, 3}, 4);
  std::vector<float> row = {0, 0, 0, 0};
  adj.apply(row);
  CHECK(row == std::vector<float>{0, 0, 0, 0});  // nothing generated yet
  for (int32_t t : {2, 2, 2, 3}) adj.push(t);
  row = {0, 0, 0, 0};
  adj.apply(row);
  CHECK(row[0] == 0.0f);
  CHECK(row[1] == 0.0f);
  CHECK(row[2] == doctest::Approx(-(3 * 0.5 + 1.0)));
  CHECK(row[3] == doctest::Approx(-(1 * 0.5 + 1.0)));
}

TEST_CASE("the changes apply in vLLM's order: bias, then repetition, then frequency and presence") {
  LogitsAdjust a;
  a.bias = {{0, 2.0f}, {1, -6.0f}};
  a.repetition_penalty = 2.0f;
  a.frequency_penalty = 1.0f;
  LogitsAdjuster adj(a, std::vector<int32_t>{}, 2);
  adj.push(0);
  adj.push(1);
  std::vector<float> row = {2, 2};
  adj.apply(row);
  // 0: (2 + 2) / 2 - 1 = 1; 1: (2 - 6) * 2 - 1 = -9 (the bias made it negative before the penalty)
  CHECK(row == std::vector<float>{1, -9});
}
