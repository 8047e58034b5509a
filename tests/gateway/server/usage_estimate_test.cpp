// gateway/server/usage_estimate (G12): the synthesised usage object and its sources, the
// request estimate by hand-counted cases, and the estimate against a real count — the request
// rendered with Qwen3's chat template and counted with Qwen3's tokenizer (node,
// qwen3_prompt_tokens.mjs, node_modules at the repository root), with tools and without.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>
#include <string>

#include <nlohmann/json.hpp>

#include "gateway/server/usage_estimate.hpp"
#include "tests/gateway/cli/cli_run.hpp"
#include "tests/gateway/server/fixture_files.hpp"

using nlohmann::json;
using servedeck::test::read_gateway_fixture;

namespace {

/// {"with_tools", "without_tools"} for fixture `name`, from the node reference.
json qwen3_counts(const std::string& name) {
  const std::string src = SERVEDECK_SOURCE_DIR;
  const std::string cmd = "SERVEDECK_SOURCE_DIR='" + src + "' node '" + src +
                          "/tests/gateway/server/qwen3_prompt_tokens.mjs' '" + src + "/tests/gateway/server/fixtures/" +
                          name + "' 2>&1";
  const sdtest::Run run = sdtest::cli_cmd(cmd);
  REQUIRE_MESSAGE(run.rc == 0, "node failed: " << run.out);
  return json::parse(run.out);
}

}  // namespace

TEST_CASE("G12 prompt estimate: within 15% of Qwen3's template + tokenizer on the fixture requests") {
  for (const std::string name : {"g12_request.json", "g12_request_code.json"}) {
    CAPTURE(name);
    const json ref = qwen3_counts(name);
    json body = json::parse(servedeck::test::read_gateway_fixture(name));
    const auto with_tools = servedeck::gateway::estimate_request_tokens(body);
    body.erase("tools");
    const auto without_tools = servedeck::gateway::estimate_request_tokens(body);
    MESSAGE(name << ": estimate " << with_tools << " vs Qwen3 " << ref["with_tools"] << " (with tools), "
                 << without_tools << " vs " << ref["without_tools"] << " (without)");
    const double real_with = ref["with_tools"].get<double>();
    const double real_without = ref["without_tools"].get<double>();
    REQUIRE(real_with > real_without);  // the reference did render the tools
    CHECK(std::fabs(static_cast<double>(with_tools) - real_with) <= 0.15 * real_with);
    CHECK(std::fabs(static_cast<double>(without_tools) - real_without) <= 0.15 * real_without);
  }
}

TEST_CASE("synthesize_usage: sources, most exact first") {
  using servedeck::gateway::synthesize_usage;
  SUBCASE("prompt_n + cache_n and predicted_n: all measured, not flagged as an estimate") {
    auto u = synthesize_usage(json{{"prompt_n", 20}, {"cache_n", 100}, {"predicted_n", 7}}, 999, 3, "output_chunks");
    CHECK(u["prompt_tokens"] == 120);
    CHECK(u["completion_tokens"] == 7);
    CHECK(u["total_tokens"] == 127);
    CHECK(u["servedeck_estimated"] == false);
    CHECK(u["servedeck_usage_source"] ==
          json{{"prompt_tokens", "engine_timings"}, {"completion_tokens", "engine_timings"}});
  }
  SUBCASE("no timings, unknown prompt: 0, source unknown, flagged") {
    auto u = synthesize_usage(json(), -1, 4, "output_chunks");
    CHECK(u["prompt_tokens"] == 0);
    CHECK(u["completion_tokens"] == 4);
    CHECK(u["servedeck_estimated"] == true);
    CHECK(u["servedeck_usage_source"]["prompt_tokens"] == "unknown");
  }
  SUBCASE("malformed timings are ignored") {
    auto u = synthesize_usage(json{{"prompt_n", "x"}, {"cache_n", -5}, {"predicted_n", 2.5}}, 10, 4, "output_chunks");
    CHECK(u["prompt_tokens"] == 10);
    CHECK(u["completion_tokens"] == 4);
    CHECK(u["servedeck_usage_source"] ==
          json{{"prompt_tokens", "request_estimate"}, {"completion_tokens", "output_chunks"}});
    CHECK_NOTHROW(synthesize_usage(json::array({1, 2}), 1, 1, "output_chunks"));
  }
}

TEST_CASE("estimate_request_tokens: bytes / 4 plus template overhead; token-id prompts exact") {
  using servedeck::gateway::estimate_request_tokens;
  // 8 bytes → 2, + 5 for the one message, + 3 for the assistant header.
  CHECK(estimate_request_tokens(json::parse(R"({"messages":[{"role":"user","content":"12345678"}]})")) == 10);
  // Text parts count, images do not: "abcd" → 1 (+5 +3).
  CHECK(estimate_request_tokens(json::parse(
            R"({"messages":[{"role":"user","content":[{"type":"text","text":"abcd"},{"type":"image_url","image_url":{"url":"data:x"}}]}]})")) == 9);
  CHECK(estimate_request_tokens(json::parse(R"({"prompt":"abcdefgh"})")) == 2);
  CHECK(estimate_request_tokens(json::parse(R"({"prompt":[1,2,3]})")) == 3);
  CHECK(estimate_request_tokens(json::parse(R"({"prompt":[[1,2],[3]]})")) == 3);
  CHECK(estimate_request_tokens(json::parse("[]")) == 0);
  // The G12 request (counted by hand from the fixture): 190 bytes of message text → 48, + 5 × 5
  // messages + 3 header + 12 for the one tool call + 3 for the one tool result = 91; tools
  // serialised 337 bytes → 85, + 100 around them = 185.
  CHECK(estimate_request_tokens(json::parse(read_gateway_fixture("g12_request.json"))) == 276);
}
