// JSON inside strings is outside text too: tool-call `arguments` echoed in a request, streamed
// or returned by the engine, hermes blocks in content, values coerced by schema. Each holds a
// document nested 100000 levels deep (200 KB), which nlohmann's recursive printer and copier
// cannot take (a stack overflow, the whole daemon gone). The policies parse such strings with
// parse_untrusted (depth-bounded), so each is read as text, never as a 100000-level document.
#include <doctest/doctest.h>

#include <string>

#include "common/json_limits.hpp"

#include "policies/pipeline.hpp"
#include "policies/restore_reasoning.hpp"
#include "policy_test_support.hpp"

using namespace servedeck;
using namespace servedeck::policies;
using namespace servedeck::policies::testing;

namespace {

constexpr std::size_t kDepth = 100000;

/// "[[[…]]]" nested kDepth levels: valid JSON that no recursive printer survives.
std::string deep_array() { return std::string(kDepth, '[') + std::string(kDepth, ']'); }

json tool(const std::string& name, json properties, json required = json::array()) {
  return {{"type", "function"},
          {"function", {{"name", name}, {"parameters", {{"type", "object"}, {"properties", properties}, {"required", required}}}}}};
}

json tools_request() {
  return {{"messages", json::array({{{"role", "user"}, {"content", "hi"}}})},
          {"tools", json::array({tool("read", {{"path", {{"type", "string"}}}, {"items", {{"type", "array"}}}}, {"path"})})}};
}

json echoed_call(const std::string& arguments) {
  return {{"role", "assistant"}, {"content", nullptr},
          {"tool_calls", json::array({{{"id", "call_deep"}, {"type", "function"},
                                       {"function", {{"name", "read"}, {"arguments", arguments}}}}})}};
}

}  // namespace

TEST_CASE("field failure: echoed tool-call arguments nested 100000 deep (restore_reasoning + sanitize_tool_tags)") {
  auto model = glm_entry();
  model.policies.restore_reasoning = true;
  ReasoningStore store;
  for (const std::string& args : {deep_array(), std::string(kDepth, '['), "{\"path\": " + deep_array() + "}"}) {
    RequestContext ctx;
    ctx.model = &model;
    ctx.requested_id = "glm53-flash";
    ctx.reasoning_store = &store;
    ctx.prompt_tokens = 1000;
    json body = tools_request();
    body["messages"].push_back(echoed_call(args));
    body["messages"].push_back({{"role", "user"}, {"content", "again"}});
    RequestPipeline p(ctx);
    auto err = p.apply(body);
    CHECK_FALSE(err.has_value());
    // the echoed arguments reach the engine as the client sent them (text, not re-serialised)
    CHECK(body["messages"][1]["tool_calls"][0]["function"]["arguments"] == args);
  }
  // the reasoning store keys such a turn by its text, and finds it again
  json turn = echoed_call(deep_array());
  turn["tool_calls"][0]["id"] = "";
  store.remember(turn, "thinking");
  CHECK(store.recall(turn) == std::optional<std::string>("thinking"));
}

TEST_CASE("deeply nested JSON in engine output: coerced values, hermes blocks, streamed arguments") {
  auto model = glm_entry();
  model.policies.coerce_tool_argument_types = true;
  model.policies.answer_rescue = true;
  Counter counter;

  SUBCASE("a value the schema types as an array, holding a 100000-deep array, stays a string") {
    json args = {{"path", "a"}, {"items", deep_array()}};
    json body = {{"choices", json::array({{{"index", 0}, {"finish_reason", "tool_calls"},
                                           {"message", {{"role", "assistant"}, {"content", ""},
                                                        {"tool_calls", json::array({{{"id", "c1"}, {"type", "function"},
                                                            {"function", {{"name", "read"}, {"arguments", dump_safe(args)}}}}})}}}}})}};
    ResponseContext ctx{&model, "glm53-flash", tools_request(), counter.fn(), nullptr};
    ResponsePipeline p(ctx);
    REQUIRE_FALSE(p.apply_body(body).has_value());
    json out = parse_untrusted(body["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"].get<std::string>());
    REQUIRE(out.is_object());
    CHECK(out["items"] == deep_array());
  }

  SUBCASE("a hermes <tool_call> block in content whose arguments nest 100000 deep is not taken for a call") {
    std::string content = "<tool_call>{\"name\": \"read\", \"arguments\": {\"path\": \"a\", \"items\": " + deep_array() +
                          "}}</tool_call>";
    json body = {{"choices", json::array({{{"index", 0}, {"finish_reason", "stop"},
                                           {"message", {{"role", "assistant"}, {"content", content}}}}})}};
    ResponseContext ctx{&model, "glm53-flash", tools_request(), counter.fn(), nullptr};
    ResponsePipeline p(ctx);
    REQUIRE_FALSE(p.apply_body(body).has_value());
    CHECK(body["choices"][0]["message"]["content"] == content);
    CHECK_FALSE(body["choices"][0]["message"].contains("tool_calls"));
  }

  SUBCASE("streamed: the same arguments in 64 chunks, then the same block in content") {
    json args = {{"path", "a"}, {"items", deep_array()}};
    std::string text = dump_safe(args);
    std::vector<json> chunks;
    const std::size_t step = text.size() / 64 + 1;
    for (std::size_t i = 0; i < text.size(); i += step) chunks.push_back(args_chunk(text.substr(i, step), i == 0 ? "read" : ""));
    chunks.push_back(chunk(json::object(), "tool_calls"));
    ResponseContext ctx{&model, "glm53-flash", tools_request(), counter.fn(), nullptr};
    std::optional<PolicyError> err;
    auto a = assemble(run_stream(ctx, chunks, &err));
    REQUIRE_FALSE(err.has_value());
    REQUIRE(a.calls.count(0) == 1);
    json got = parse_untrusted(a.calls[0]["arguments"].get<std::string>());
    REQUIRE(got.is_object());
    CHECK(got["items"] == deep_array());

    std::string content = "<tool_call>read<arg_key>path</arg_key><arg_value>a</arg_value><arg_key>items</arg_key><arg_value>" +
                          deep_array() + "</arg_value></tool_call>";
    ResponseContext ctx2{&model, "glm53-flash", tools_request(), counter.fn(), nullptr};
    std::vector<json> in;
    for (std::size_t i = 0; i < content.size(); i += 4096) in.push_back(chunk({{"content", content.substr(i, 4096)}}));
    in.push_back(chunk(json::object(), "tool_calls"));
    auto b = assemble(run_stream(ctx2, in, &err));
    REQUIRE_FALSE(err.has_value());
    REQUIRE(b.calls.count(0) == 1);
    json rescued = parse_untrusted(b.calls[0]["arguments"].get<std::string>());
    REQUIRE(rescued.is_object());
    CHECK(rescued["items"] == deep_array());  // typed_from_text refused the depth: the text is kept
  }
}
