#include <doctest/doctest.h>

#include <cstdint>
#include <limits>

#include "policies/fit_output_budget.hpp"
#include "tests/policies/policy_test_support.hpp"

using namespace servedeck;
using namespace servedeck::policies;
using namespace servedeck::policies::testing;

namespace {

registry::ModelEntry small_model() {
  registry::ModelEntry m;
  m.name = "tiny-chat";
  m.served_name = "tiny-chat";
  m.ctx = 16384;
  return m;
}

}  // namespace

TEST_CASE("fitted_budget: only ever lowered, to ctx - prompt, never below the floor") {
  CHECK(fitted_budget(32000, 256, 16384, 6000) == 10384);
  CHECK(fitted_budget(1000, 256, 16384, 6000) == 1000);   // fits: unchanged
  CHECK(fitted_budget(32000, 256, 16384, 16300) == 256);  // no room: the floor
  CHECK(fitted_budget(100, 256, 16384, 16300) == 100);    // never raised to the floor
}

TEST_CASE("fit_output_budget lowers both budget keys, notes a header and counts; off or uncounted it does nothing") {
  auto m = small_model();
  Counter counter;
  RequestContext ctx;
  ctx.model = &m;
  ctx.count_repair = counter.fn();
  ctx.prompt_tokens = 6000;
  json body = {{"messages", json::array({{{"role", "user"}, {"content", "hi"}}})}, {"max_tokens", 32000},
               {"max_completion_tokens", 16384}};
  apply_fit_output_budget(body, ctx);
  CHECK(body["max_tokens"] == 10384);
  CHECK(body["max_completion_tokens"] == 10384);
  CHECK(counter.counts["fit_output_budget"] == 2);
  REQUIRE(ctx.response_headers.size() == 1);
  CHECK(ctx.response_headers[0].first == k_output_budget_header);
  CHECK(ctx.response_headers[0].second ==
        "max_tokens 32000 -> 10384 (ctx 16384, prompt 6000 tokens counted by the engine's /tokenize, floor 256); "
        "max_completion_tokens 16384 -> 10384 (ctx 16384, prompt 6000 tokens counted by the engine's /tokenize, floor 256)");

  RequestContext unknown;
  unknown.model = &m;
  json b2 = {{"max_tokens", 32000}};
  apply_fit_output_budget(b2, unknown);  // no count: untouched
  CHECK(b2["max_tokens"] == 32000);

  m.policies.fit_output_budget = false;
  json b3 = {{"max_tokens", 32000}};
  apply_fit_output_budget(b3, ctx);
  CHECK(b3["max_tokens"] == 32000);
}

TEST_CASE("budget_may_overflow decides whether the prompt must be counted (a byte-count upper bound)") {
  json small = {{"messages", json::array({{{"role", "user"}, {"content", "hi"}}})}, {"max_tokens", 100}};
  CHECK_FALSE(budget_may_overflow(small, 16384));
  small["max_tokens"] = 16000;
  CHECK(budget_may_overflow(small, 16384));
  json none = {{"messages", json::array({{{"role", "user"}, {"content", "hi"}}})}};
  CHECK_FALSE(budget_may_overflow(none, 16384));
  CHECK(prompt_tokens_upper_bound(small) >= 512 + 16);

  // The pipeline asks for the count exactly then.
  auto m = small_model();
  RequestContext ctx;
  ctx.model = &m;
  RequestPipeline rp(ctx);
  CHECK(rp.wants_prompt_tokens(small));
  small["max_tokens"] = 100;
  CHECK_FALSE(rp.wants_prompt_tokens(small));
}

TEST_CASE("budgets near INT64_MAX and hostile prompt counts saturate instead of overflowing") {
  // Regression: max_tokens near INT64_MAX plus the prompt's bound overflowed (UB; in practice
  // negative: "fits", so the budget went to the engine uncounted), and a budget above INT64_MAX
  // (kept unsigned by the parser) read as -1.
  constexpr int64_t big = std::numeric_limits<int64_t>::max();
  json body = {{"messages", json::array({{{"role", "user"}, {"content", "hi"}}})}, {"max_tokens", big}};
  CHECK(budget_may_overflow(body, 16384));
  body["max_tokens"] = std::numeric_limits<uint64_t>::max();
  CHECK(budget_may_overflow(body, 16384));
  CHECK(fitted_budget(big, 256, 16384, std::numeric_limits<int64_t>::min()) == big);  // ctx − prompt saturates
  CHECK(fitted_budget(big, 256, 16384, 6000) == 10384);

  auto m = small_model();
  Counter counter;
  RequestContext ctx;
  ctx.model = &m;
  ctx.count_repair = counter.fn();
  ctx.prompt_tokens = 6000;
  apply_fit_output_budget(body, ctx);
  CHECK(body["max_tokens"] == 10384);
  json signed_big = {{"max_tokens", big}};
  apply_fit_output_budget(signed_big, ctx);
  CHECK(signed_big["max_tokens"] == 10384);
}
