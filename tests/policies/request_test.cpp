// Request-side policies: effort presets, reasoning_effort mapping, min_output_tokens (seed figures),
// thinking_token_budget, unsupported_kwargs (G16), request_cleanup (G12), flatten_content,
// reasoning dialects, echoed-history sanitising.
#include <doctest/doctest.h>

#include <cstdint>
#include <limits>

#include "policies/effort_presets.hpp"
#include "policies/min_output_tokens.hpp"
#include "policies/pipeline.hpp"
#include "policies/thinking_token_budget.hpp"
#include "policy_test_support.hpp"

using namespace servedeck;
using namespace servedeck::policies;
using namespace servedeck::policies::testing;

namespace {

struct Req {
  registry::ModelEntry model = glm_entry();
  Counter counter;
  RequestContext ctx;
  explicit Req(const std::string& requested = "glm53-flash") { set(requested); }
  void set(const std::string& requested) {
    ctx.model = &model;
    ctx.requested_id = requested;
    ctx.preset = nullptr;
    for (const auto& p : model.presets) {
      if (p.alias == requested) ctx.preset = &p;
    }
    ctx.count_repair = counter.fn();
  }
  json run(json body, std::optional<int64_t> prompt = std::nullopt, bool estimated = false) {
    ctx.prompt_tokens = prompt;
    ctx.prompt_tokens_estimated = estimated;
    RequestPipeline p(ctx);
    auto err = p.apply(body);
    REQUIRE_FALSE(err.has_value());
    return body;
  }
};

json user_body() { return {{"messages", json::array({{{"role", "user"}, {"content", "hi"}}})}}; }

}  // namespace

TEST_CASE("effort preset alias merges chat_template_kwargs as gap-filling defaults") {
  Req r("glm53-flash-low");
  json out = r.run(user_body());
  CHECK(out["chat_template_kwargs"]["reasoning_effort"] == "low");

  // the client's explicit kwarg wins over the preset
  json body = user_body();
  body["chat_template_kwargs"] = {{"reasoning_effort", "high"}, {"clear_thinking", false}};
  out = r.run(body);
  CHECK(out["chat_template_kwargs"]["reasoning_effort"] == "high");
  CHECK(out["chat_template_kwargs"]["clear_thinking"] == false);

  // the bare id keeps the model's default: nothing added
  Req bare("glm53-flash");
  out = bare.run(user_body());
  CHECK_FALSE(out.contains("chat_template_kwargs"));
  CHECK(bare.counter.counts.empty());
}

TEST_CASE("the max preset reaches the same model with reasoning_effort max") {
  Req r("glm53-flash-max");
  CHECK(r.run(user_body())["chat_template_kwargs"]["reasoning_effort"] == "max");
}

TEST_CASE("top-level reasoning_effort is mapped onto accepted values, never forwarded raw") {
  const auto& cfg = glm_entry().policies;
  CHECK(map_reasoning_effort("low", cfg) == "low");
  CHECK(map_reasoning_effort("medium", cfg) == "high");   // tie between low and high → higher
  CHECK(map_reasoning_effort("minimal", cfg) == "low");
  CHECK(map_reasoning_effort("xhigh", cfg) == "max");
  CHECK(map_reasoning_effort("turbo", cfg) == "max");     // off the scale → default_reasoning_effort

  Req r;
  json body = user_body();
  body["reasoning_effort"] = "medium";
  json out = r.run(body);
  CHECK_FALSE(out.contains("reasoning_effort"));
  CHECK(out["chat_template_kwargs"]["reasoning_effort"] == "high");
  CHECK(r.counter["effort_presets"] == 1);

  // an accepted top-level value moves into the kwargs unchanged, and is not a repair
  Req r2;
  body["reasoning_effort"] = "low";
  out = r2.run(body);
  CHECK(out["chat_template_kwargs"]["reasoning_effort"] == "low");
  CHECK(r2.counter["effort_presets"] == 0);

  // an unaccepted value inside chat_template_kwargs is mapped too
  Req r3;
  json b3 = user_body();
  b3["chat_template_kwargs"] = {{"reasoning_effort", "medium"}};
  CHECK(r3.run(b3)["chat_template_kwargs"]["reasoning_effort"] == "high");

  // the client's top-level value beats the preset's default
  Req r4("glm53-flash-max");
  body["reasoning_effort"] = "low";
  CHECK(r4.run(body)["chat_template_kwargs"]["reasoning_effort"] == "low");
}

TEST_CASE("min_output_tokens: seed figures 200 → 8192, clamping near a full context, absent budget") {
  CHECK(raised_budget(200, 8192, 327680, 1000) == 8192);
  CHECK(raised_budget(200, 8192, 327680, 325000) == 2680);   // 327680 − 325000
  CHECK(raised_budget(200, 8192, 327680, 327600) == 200);    // no room above the client's budget: never lowered
  CHECK(raised_budget(16000, 8192, 327680, 1000) == 16000);  // only upward

  Req r;
  json body = user_body();
  body["max_tokens"] = 200;
  {
    RequestPipeline p(r.ctx);
    CHECK(p.wants_prompt_tokens(body));
  }
  json out = r.run(body, 1000);
  CHECK(out["max_tokens"] == 8192);
  CHECK(r.counter["min_output_tokens"] == 1);
  CHECK(r.counter.last_model == "glm53");
  REQUIRE_FALSE(r.ctx.log.empty());
  CHECK(r.ctx.log.back().find("200 → 8192") != std::string::npos);
  CHECK(r.ctx.log.back().find("from /tokenize") != std::string::npos);

  Req near;
  json b2 = user_body();
  b2["max_completion_tokens"] = 200;
  out = near.run(b2, 325000, true);
  CHECK(out["max_completion_tokens"] == 2680);
  CHECK(near.ctx.log.back().find("estimated") != std::string::npos);

  Req absent;
  {
    RequestPipeline p(absent.ctx);
    CHECK_FALSE(p.wants_prompt_tokens(user_body()));
  }
  out = absent.run(user_body());
  CHECK_FALSE(out.contains("max_tokens"));
  CHECK_FALSE(out.contains("max_completion_tokens"));

  Req big;
  json b3 = user_body();
  b3["max_tokens"] = 32768;
  {
    RequestPipeline p(big.ctx);
    CHECK_FALSE(p.wants_prompt_tokens(b3));
  }
  CHECK(big.run(b3)["max_tokens"] == 32768);
  CHECK(big.counter["min_output_tokens"] == 0);
}

TEST_CASE("min_output_tokens on the recorded Copilot request; estimate is conservative") {
  json req = fixture("list_dir_request.json");
  int64_t est = estimate_prompt_tokens(req);
  // the serialised messages+tools are ~900 bytes; ~4 bytes/token would be ~225 tokens
  CHECK(est > static_cast<int64_t>((req["messages"].dump().size() + req["tools"].dump().size()) / 4));
  Req r("glm53-flash-high");
  json out = r.run(req, est, true);
  CHECK(out["max_tokens"] == 8192);
  CHECK(out["chat_template_kwargs"]["reasoning_effort"] == "high");
}

TEST_CASE("thinking_token_budget: preset default min(10000, 75% of the stated budget)") {
  CHECK(default_thinking_budget(10000, 8192) == 6144);
  CHECK(default_thinking_budget(10000, 32768) == 10000);
  CHECK(default_thinking_budget(10000, std::nullopt) == 10000);

  Req r("glm53-flash-high");
  r.model.policies.thinking_token_budget = true;
  r.model.presets[1].thinking_token_budget = 10000;
  r.set("glm53-flash-high");
  json body = user_body();
  body["max_tokens"] = 200;
  json out = r.run(body, 1000);
  CHECK(out["max_tokens"] == 8192);
  CHECK(out["thinking_token_budget"] == 6144);  // from the raised budget

  body["thinking_token_budget"] = 500;  // the client's value wins
  CHECK(r.run(body, 1000)["thinking_token_budget"] == 500);

  Req unsupported("glm53-flash");
  json b2 = user_body();
  b2["thinking_token_budget"] = 500;
  CHECK_FALSE(unsupported.run(b2).contains("thinking_token_budget"));
}

TEST_CASE("min_output_tokens and thinking_token_budget saturate on budgets near INT64_MAX and hostile prompt counts") {
  // Regression: budget × 3 overflowed (UB) for budgets past INT64_MAX / 3, ctx − prompt for a
  // hostile count, and a budget above INT64_MAX read as -1 ("below the floor": raised).
  constexpr int64_t big = std::numeric_limits<int64_t>::max();
  CHECK(default_thinking_budget(10000, big) == 10000);
  CHECK(default_thinking_budget(big, big) == big / 4 * 3 + 2);  // floor(3 × big / 4)
  CHECK(default_thinking_budget(10000, 13) == 9);                // floor(39 / 4), as before
  CHECK(raised_budget(200, 8192, 327680, std::numeric_limits<int64_t>::min()) == 8192);
  CHECK(raised_budget(200, 8192, 327680, big) == 200);
  json huge = {{"max_tokens", std::numeric_limits<uint64_t>::max()}};
  CHECK_FALSE(budget_below_floor(huge, 8192));
  huge["max_tokens"] = big;
  CHECK_FALSE(budget_below_floor(huge, 8192));
}

TEST_CASE("G16: unsupported enable_thinking:false is rewritten onto the lowest accepted effort") {
  Req r("glm53-flash-high");
  r.model.policies.unsupported_kwargs = {"enable_thinking"};
  json body = user_body();
  body["chat_template_kwargs"] = {{"enable_thinking", false}};
  json out = r.run(body);
  CHECK_FALSE(out["chat_template_kwargs"].contains("enable_thinking"));
  CHECK(out["chat_template_kwargs"]["reasoning_effort"] == "low");  // beats the -high preset default
  CHECK(r.counter["unsupported_kwargs"] == 1);

  Req t;
  t.model.policies.unsupported_kwargs = {"enable_thinking"};
  body["chat_template_kwargs"] = {{"enable_thinking", true}};
  out = t.run(body);
  CHECK_FALSE(out["chat_template_kwargs"].contains("enable_thinking"));
  CHECK_FALSE(out["chat_template_kwargs"].contains("reasoning_effort"));
}

TEST_CASE("G12: refusal:null, vendor tool keys, missing parameters, stream_options") {
  Req r;
  r.model.policies.extra = {{"request_cleanup", {{"drop_top_level", {"stream_options"}}}}};
  json body = {
      {"stream_options", {{"include_usage", true}}},
      {"messages", json::array({{{"role", "user"}, {"content", "x"}},
                                {{"role", "assistant"}, {"content", "ok"}, {"refusal", nullptr}, {"tool_calls", json::array()}}})},
      {"tools", json::array({{{"type", "function"}, {"cache_control", {{"type", "ephemeral"}}},
                              {"function", {{"name", "ping"}, {"description", "d"}, {"defer_loading", true}}}}})}};
  json out = r.run(body);
  CHECK_FALSE(out["messages"][1].contains("refusal"));
  CHECK_FALSE(out["messages"][1].contains("tool_calls"));
  CHECK(out["messages"][1]["content"] == "ok");
  CHECK_FALSE(out["tools"][0].contains("cache_control"));
  CHECK_FALSE(out["tools"][0]["function"].contains("defer_loading"));
  CHECK(out["tools"][0]["function"]["parameters"] == json{{"type", "object"}, {"properties", json::object()}});
  CHECK_FALSE(out.contains("stream_options"));
  CHECK(r.counter["request_cleanup"] == 1);

  Req off;  // not configured: untouched
  CHECK(off.run(body) == body);
}

TEST_CASE("flatten_content joins text parts of tool/system/assistant messages") {
  Req r;
  r.model.policies.flatten_content = true;
  json req = fixture("list_dir_request.json");
  req["messages"].push_back({{"role", "tool"}, {"tool_call_id", "c1"}, {"content", json::array({{{"type", "text"}, {"text", "a"}}, {{"type", "text"}, {"text", "b"}}})}});
  req["messages"].push_back({{"role", "user"}, {"content", json::array({{{"type", "text"}, {"text", "u"}}})}});
  req["messages"].push_back({{"role", "tool"}, {"tool_call_id", "c2"}, {"content", json::array({{{"type", "image_url"}, {"image_url", {{"url", "x"}}}}})}});
  json out = r.run(req);
  CHECK(out["messages"][0]["content"] == "You are a coding agent.\nUse the tools.");
  CHECK(out["messages"][2]["content"] == "a\nb");
  CHECK(out["messages"][3]["content"].is_array());  // user messages are not flattened
  CHECK(out["messages"][4]["content"].is_array());  // a non-text part stays
  CHECK(r.counter["flatten_content"] == 2);
}

TEST_CASE("reasoning dialects: incoming `reasoning` becomes reasoning_content") {
  Req r;
  json body = user_body();
  body["messages"].push_back({{"role", "assistant"}, {"content", "hello"}, {"reasoning", "thought"}});
  body["messages"].push_back({{"role", "assistant"}, {"content", "x"}, {"reasoning", "a"}, {"reasoning_content", "b"}});
  json out = r.run(body);
  CHECK(out["messages"][1]["reasoning_content"] == "thought");
  CHECK_FALSE(out["messages"][1].contains("reasoning"));
  CHECK(out["messages"][2]["reasoning_content"] == "b");
  CHECK_FALSE(out["messages"][2].contains("reasoning"));
}

TEST_CASE("sanitize_tool_tags repairs the echoed history so the broken key never reaches the engine") {
  Req r;
  json req = fixture("list_dir_request.json");
  req["messages"].push_back({{"role", "assistant"}, {"content", nullptr},
                             {"tool_calls", json::array({{{"id", "c1"}, {"type", "function"},
                                 {"function", {{"name", "list_dir"}, {"arguments", "{\"path</arg_key>\": \"/Users/user/Desktop/project\"}"}}}}})}});
  req["messages"].push_back({{"role", "tool"}, {"tool_call_id", "c1"}, {"content", "src\nREADME.md"}});
  json out = r.run(req, 1000);
  CHECK(out["messages"][2]["tool_calls"][0]["function"]["arguments"] == "{\"path\": \"/Users/user/Desktop/project\"}");
  CHECK(r.counter["sanitize_tool_tags"] == 1);
}

TEST_CASE("apply rejects malformed bodies with a message, never throws") {
  Req r;
  RequestPipeline p(r.ctx);
  json bad = {{"messages", "nope"}};
  auto err = p.apply(bad);
  REQUIRE(err.has_value());
  CHECK(err->find("messages") != std::string::npos);
  json bad2 = {{"messages", json::array()}, {"chat_template_kwargs", 3}};
  CHECK(p.apply(bad2).has_value());
}
