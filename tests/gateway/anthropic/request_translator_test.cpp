#include <doctest/doctest.h>

#include <fstream>
#include <sstream>

#include "gateway/anthropic/request_translator.hpp"

using namespace servedeck::gateway::anthropic;
using nlohmann::json;

namespace {

TranslatedRequest translate(const json& body, TranslateOptions opt = {}) {
  TranslatedRequest out;
  auto err = translate_request(body, opt, out);
  REQUIRE_MESSAGE(!err, (err ? err->message : ""));
  return out;
}

std::string refusal(const json& body, TranslateOptions opt = {}) {
  TranslatedRequest out;
  auto err = translate_request(body, opt, out);
  REQUIRE(err);
  return err->message;
}

json load_fixture(const std::string& name) {
  std::ifstream f(std::string(SERVEDECK_SOURCE_DIR) + "/tests/gateway/anthropic/fixtures/" + name);
  REQUIRE_MESSAGE(f.good(), name);
  std::stringstream ss;
  ss << f.rdbuf();
  return json::parse(ss.str());
}

}  // namespace

TEST_CASE("system as a string or text blocks; Claude Code's billing header block is removed unless configured off") {
  json body = {{"model", "m"}, {"max_tokens", 100},
               {"system", json::array({{{"type", "text"}, {"text", "x-anthropic-billing-header: cc_version=2.1.197.123; cc_entrypoint=cli; cch=5e1f2;"}},
                                       {{"type", "text"}, {"text", "You are an agent."}, {"cache_control", {{"type", "ephemeral"}}}},
                                       {{"type", "text"}, {"text", "Be brief."}}})},
               {"messages", json::array({{{"role", "user"}, {"content", "hi"}}})}};
  auto t = translate(body);
  CHECK(t.billing_blocks_removed == 1);
  CHECK(t.chat["messages"][0] == json{{"role", "system"}, {"content", "You are an agent.\nBe brief."}});
  CHECK(t.chat["max_tokens"] == 100);

  TranslateOptions keep;
  keep.strip_billing_header = false;
  auto k = translate(body, keep);
  CHECK(k.billing_blocks_removed == 0);
  CHECK(k.chat["messages"][0]["content"].get<std::string>().rfind("x-anthropic-billing-header:", 0) == 0);

  // Two requests that differ only in the header's cch value give the same engine prompt.
  json other = body;
  other["system"][0]["text"] = "x-anthropic-billing-header: cc_version=2.1.197.123; cc_entrypoint=cli; cch=0b9aa;";
  CHECK(translate(other).chat == t.chat);

  json as_string = {{"model", "m"}, {"system", "X-Anthropic-Billing-Header: cch=1;\nYou are an agent."},
                    {"messages", json::array({{{"role", "user"}, {"content", "hi"}}})}};
  CHECK(translate(as_string).chat["messages"][0]["content"] == "You are an agent.");
  CHECK(is_billing_header("  x-anthropic-billing-header: a"));
  CHECK_FALSE(is_billing_header("You are x-anthropic-billing-header:"));
}

TEST_CASE("a tool round trip: tool_use becomes tool_calls, tool_result (string, blocks, is_error) tool messages before the user's text") {
  json body = {{"model", "m"}, {"max_tokens", 50},
               {"messages", json::array({
                   {{"role", "user"}, {"content", "weather in Paris and Rome?"}},
                   {{"role", "assistant"}, {"content", json::array({
                       {{"type", "thinking"}, {"thinking", "two cities: two calls"}, {"signature", "servedeck-v1.0123456789abcdef"}},
                       {{"type", "text"}, {"text", "Checking."}},
                       {{"type", "tool_use"}, {"id", "toolu_1"}, {"name", "get_weather"}, {"input", {{"city", "Paris"}}}},
                       {{"type", "tool_use"}, {"id", "toolu_2"}, {"name", "get_weather"}, {"input", {{"city", "Rome"}}}}})}},
                   {{"role", "user"}, {"content", json::array({
                       {{"type", "tool_result"}, {"tool_use_id", "toolu_1"}, {"content", "sunny"}},
                       {{"type", "tool_result"}, {"tool_use_id", "toolu_2"}, {"is_error", true},
                        {"content", json::array({{{"type", "text"}, {"text", "service down"}}, {{"type", "text"}, {"text", "retry later"}}})}},
                       {{"type", "text"}, {"text", "and tomorrow?"}, {"cache_control", {{"type", "ephemeral"}}}}})}}})}};
  auto t = translate(body);
  const json& m = t.chat["messages"];
  REQUIRE(m.size() == 5);
  CHECK(m[0] == json{{"role", "user"}, {"content", "weather in Paris and Rome?"}});
  CHECK(m[1]["role"] == "assistant");
  CHECK(m[1]["content"] == "Checking.");
  // The thinking of an earlier turn is kept (as the template's reasoning), whatever its signature.
  CHECK(m[1]["reasoning_content"] == "two cities: two calls");
  REQUIRE(m[1]["tool_calls"].size() == 2);
  CHECK(m[1]["tool_calls"][0] == json{{"id", "toolu_1"}, {"type", "function"},
                                      {"function", {{"name", "get_weather"}, {"arguments", "{\"city\":\"Paris\"}"}}}});
  CHECK(m[2] == json{{"role", "tool"}, {"tool_call_id", "toolu_1"}, {"content", "sunny"}});
  CHECK(m[3] == json{{"role", "tool"}, {"tool_call_id", "toolu_2"}, {"content", "Error: service down\nretry later"}});
  CHECK(m[4] == json{{"role", "user"}, {"content", "and tomorrow?"}});
  CHECK(t.warnings.empty());
}

TEST_CASE("tools with input_schema; server tools dropped with a warning; tool_choice auto / any / tool / none") {
  json base = {{"model", "m"}, {"messages", json::array({{{"role", "user"}, {"content", "x"}}})},
               {"tools", json::array({{{"name", "Bash"}, {"description", "run"}, {"input_schema", {{"type", "object"}, {"properties", {{"command", {{"type", "string"}}}}}, {"required", {"command"}}}}},
                                      {{"name", "Noop"}},
                                      {{"type", "web_search_20250305"}, {"name", "web_search"}, {"max_uses", 5}}})}};
  auto t = translate(base);
  REQUIRE(t.chat["tools"].size() == 2);
  CHECK(t.chat["tools"][0] == json{{"type", "function"}, {"function", {{"name", "Bash"}, {"description", "run"},
                                    {"parameters", base["tools"][0]["input_schema"]}}}});
  CHECK(t.chat["tools"][1]["function"]["parameters"] == json{{"type", "object"}, {"properties", json::object()}});
  REQUIRE(t.warnings.size() == 1);
  CHECK(t.warnings[0].find("web_search_20250305") != std::string::npos);

  auto choice = [&](json tc) {
    json b = base;
    b["tool_choice"] = tc;
    return translate(b).chat;
  };
  CHECK(choice({{"type", "auto"}})["tool_choice"] == "auto");
  CHECK(choice({{"type", "any"}})["tool_choice"] == "required");
  CHECK(choice({{"type", "none"}})["tool_choice"] == "none");
  auto named = choice({{"type", "tool"}, {"name", "Bash"}, {"disable_parallel_tool_use", true}});
  CHECK(named["tool_choice"] == json{{"type", "function"}, {"function", {{"name", "Bash"}}}});
  CHECK(named["parallel_tool_calls"] == false);
}

TEST_CASE("thinking: enabled turns the reasoning switch on with the budget, disabled off, adaptive leaves the model's default") {
  json b = {{"model", "m"}, {"messages", json::array({{{"role", "user"}, {"content", "x"}}})}};
  b["thinking"] = {{"type", "enabled"}, {"budget_tokens", 2048}};
  auto on = translate(b).chat;
  CHECK(on["chat_template_kwargs"] == json{{"enable_thinking", true}});
  CHECK(on["thinking_token_budget"] == 2048);
  b["thinking"] = {{"type", "disabled"}};
  auto off = translate(b).chat;
  CHECK(off["chat_template_kwargs"] == json{{"enable_thinking", false}});
  CHECK_FALSE(off.contains("thinking_token_budget"));
  b["thinking"] = {{"type", "adaptive"}};
  b["output_config"] = {{"effort", "high"}};
  auto adaptive = translate(b).chat;
  CHECK_FALSE(adaptive.contains("chat_template_kwargs"));
  CHECK(adaptive["reasoning_effort"] == "high");
}

TEST_CASE("sampling fields, stop_sequences and stream map over; metadata and cache_control are accepted and ignored") {
  json b = {{"model", "m"}, {"max_tokens", 10}, {"stream", true}, {"temperature", 0.2}, {"top_p", 0.9}, {"top_k", 40},
            {"stop_sequences", {"END", "STOP"}}, {"metadata", {{"user_id", "u1"}}},
            {"messages", json::array({{{"role", "user"}, {"content", json::array({{{"type", "text"}, {"text", "x"}, {"cache_control", {{"type", "ephemeral"}}}}})}}})}};
  auto t = translate(b);
  CHECK(t.stream);
  CHECK(t.chat["stream"] == true);
  CHECK(t.chat["stream_options"] == json{{"include_usage", true}});
  CHECK(t.chat["temperature"] == 0.2);
  CHECK(t.chat["top_p"] == 0.9);
  CHECK(t.chat["top_k"] == 40);
  CHECK(t.chat["stop"] == json{"END", "STOP"});
  CHECK(t.stop_sequences == std::vector<std::string>{"END", "STOP"});
  CHECK_FALSE(t.chat.contains("metadata"));
  CHECK_FALSE(t.chat.contains("user"));
  CHECK(t.chat["messages"][0] == json{{"role", "user"}, {"content", "x"}});
}

TEST_CASE("images: refused with the model named when it has no vision, image_url parts when it has") {
  json b = {{"model", "m"}, {"messages", json::array({{{"role", "user"}, {"content", json::array({
                {{"type", "text"}, {"text", "what is this?"}},
                {{"type", "image"}, {"source", {{"type", "base64"}, {"media_type", "image/png"}, {"data", "iVBORw0KGgo="}}}}})}}})}};
  TranslateOptions blind;
  blind.model_name = "tiny-chat";
  const std::string why = refusal(b, blind);
  CHECK(why.find("messages.0.content.1") != std::string::npos);
  CHECK(why.find("'tiny-chat'") != std::string::npos);
  CHECK(why.find("vision") != std::string::npos);
  TranslateOptions sees;
  sees.vision = true;
  auto t = translate(b, sees);
  CHECK(t.chat["messages"][0]["content"] == json::array({{{"type", "text"}, {"text", "what is this?"}},
                                                         {{"type", "image_url"}, {"image_url", {{"url", "data:image/png;base64,iVBORw0KGgo="}}}}}));
}

TEST_CASE("bodies that are no Messages request are refused, naming the field") {
  CHECK(refusal(json::array()).find("JSON object") != std::string::npos);
  CHECK(refusal({{"messages", json::array({{{"role", "user"}, {"content", "x"}}})}}).find("model") != std::string::npos);
  CHECK(refusal({{"model", "m"}, {"messages", json::array()}}).find("messages") != std::string::npos);
  CHECK(refusal({{"model", "m"}, {"messages", json::array({{{"role", "tool"}, {"content", "x"}}})}}).find("messages.0.role") != std::string::npos);
  CHECK(refusal({{"model", "m"}, {"messages", json::array({{{"role", "user"}, {"content", 5}}})}}).find("messages.0.content") != std::string::npos);
  CHECK(refusal({{"model", "m"}, {"max_tokens", 0}, {"messages", json::array({{{"role", "user"}, {"content", "x"}}})}}).find("max_tokens") != std::string::npos);
  CHECK(refusal({{"model", "m"}, {"stream", "yes"}, {"messages", json::array({{{"role", "user"}, {"content", "x"}}})}}).find("stream") != std::string::npos);
  CHECK(refusal({{"model", "m"}, {"messages", json::array({{{"role", "user"}, {"content", json::array({{{"type", "tool_result"}}})}}})}}).find("tool_use_id") != std::string::npos);
}

TEST_CASE("Claude Code's recorded first request translates: billing header gone, in-conversation system message kept, every tool kept") {
  // fixtures/claude_code_2.1.197_first_request.json: the body `claude -p "Say hi."` (npm
  // @anthropic-ai/claude-code 2.1.197) sent to a capture server (tests/e2e/capture_server.mjs),
  // trimmed to its first 3 tools and with the metadata ids blanked.
  const json body = load_fixture("claude_code_2.1.197_first_request.json");
  REQUIRE(body["system"][0]["text"].get<std::string>().rfind("x-anthropic-billing-header:", 0) == 0);
  auto t = translate(body);
  CHECK(t.billing_blocks_removed == 1);
  const json& m = t.chat["messages"];
  CHECK(m[0]["role"] == "system");
  CHECK(m[0]["content"].get<std::string>().find("x-anthropic-billing-header") == std::string::npos);
  bool mid_system = false;
  for (std::size_t i = 1; i < m.size(); ++i) mid_system = mid_system || m[i]["role"] == "system";
  CHECK(mid_system);
  CHECK(t.chat["tools"].size() == body["tools"].size());
  CHECK(t.chat["max_tokens"] == 32000);
  CHECK(t.chat["reasoning_effort"] == "high");  // output_config.effort
  CHECK(t.stream);
}

TEST_CASE("a Messages field of the wrong type is named with what was read; content with nothing translatable says why") {
  const json msgs = json::array({{{"role", "user"}, {"content", "x"}}});
  const std::pair<json, const char*> cases[] = {
      {{{"temperature", "x"}}, "temperature: expected a number, got string"},
      {{{"tools", "x"}}, "tools: expected an array, got string"},
      {{{"tool_choice", 5}}, "tool_choice: expected an object, got number"},
      {{{"stop_sequences", "x"}}, "stop_sequences: expected an array, got string"},
      {{{"thinking", "x"}}, "thinking: expected an object, got string"},
      {{{"stream", "yes"}}, "stream: expected a boolean, got string"},
      {{{"max_tokens", "5"}}, "max_tokens: expected an integer, got string"},
  };
  for (const auto& [extra, message] : cases) {
    json b = {{"model", "m"}, {"max_tokens", 10}, {"messages", msgs}};
    for (const auto& [k, v] : extra.items()) b[k] = v;
    INFO(b.dump());
    CHECK(refusal(b) == message);
  }
  const json weird = {{"model", "m"}, {"max_tokens", 10},
                      {"messages", json::array({{{"role", "user"}, {"content", json::array({{{"type", "weird"}}})}}})}};
  CHECK(refusal(weird) == "messages: no user or assistant content the bridge can translate (dropped messages.0.content.0 of type 'weird')");
}

TEST_CASE("a text block whose text is no string, and a tool_use whose input is no object, are named") {
  auto body = [](json content, const char* role = "user") {
    return json{{"model", "m"}, {"max_tokens", 10}, {"messages", json::array({{{"role", role}, {"content", std::move(content)}}})}};
  };
  CHECK(refusal(body(json::array({{{"type", "text"}, {"text", 5}}}))) == "messages.0.content.0.text: expected a string, got number");
  CHECK(refusal(body(json::array({{{"type", "text"}, {"text", json::object()}}}), "assistant")) ==
        "messages.0.content.0.text: expected a string, got object");
  CHECK(refusal(body(json::array({{{"type", "tool_use"}, {"id", "t1"}, {"name", "f"}, {"input", "notobj"}}}), "assistant")) ==
        "messages.0.content.0.input: expected an object (the tool's arguments), got string");
}

TEST_CASE("tool_result content: blocks of the wrong shape are named, documents read as text, other types warned, never dropped silently") {
  auto body = [](json content) {
    return json{{"model", "m"}, {"max_tokens", 10}, {"messages", json::array({{{"role", "user"}, {"content", json::array({
                    {{"type", "tool_result"}, {"tool_use_id", "t1"}, {"content", std::move(content)}}})}}})}};
  };
  CHECK(refusal(body(json::array({json::array({{{"type", "text"}, {"text", "nested"}}})}))) ==
        "messages.0.content.0.content.0: expected a content block object, got array");
  CHECK(refusal(body(json::array({{{"type", "text"}, {"text", "a"}}, {{"type", "text"}, {"text", 5}}}))) ==
        "messages.0.content.0.content.1.text: expected a string, got number");
  CHECK(refusal(body(json::array({{{"type", "document"}, {"source", {{"type", "base64"}, {"media_type", "application/pdf"}, {"data", "JVBE"}}}}})))
            .find("messages.0.content.0.content.0: document blocks other than plain text") == 0);
  TranslateOptions sees;
  sees.vision = true;
  CHECK(refusal(body(json::array({{{"type", "image"}, {"source", {{"type", "file"}, {"file_id", "f1"}}}}})), sees) ==
        "messages.0.content.0.content.0.source: expected {type: base64, media_type, data} or {type: url, url}");

  auto t = translate(body(json::array({{{"type", "text"}, {"text", "head"}},
                                       {{"type", "document"}, {"source", {{"type", "text"}, {"media_type", "text/plain"}, {"data", "body"}}}},
                                       {{"type", "search_result"}, {"source", "s"}, {"title", "t"}, {"content", json::array()}}})));
  CHECK(t.chat["messages"][0] == json{{"role", "tool"}, {"tool_call_id", "t1"}, {"content", "head\nbody"}});
  REQUIRE(t.warnings.size() == 1);
  CHECK(t.warnings[0] == "dropped messages.0.content.0.content.2 of type 'search_result'");
}

TEST_CASE("a tool whose input_schema is no object is refused, naming the tool, never served without its parameters") {
  json b = {{"model", "m"}, {"messages", json::array({{{"role", "user"}, {"content", "x"}}})},
            {"tools", json::array({{{"name", "Bash"}, {"input_schema", {{"type", "object"}}}}, {{"name", "Edit"}, {"input_schema", "junk"}}})}};
  CHECK(refusal(b) == "tools.1.input_schema: expected an object (a JSON Schema), got string");
  b["tools"][1]["input_schema"] = json::array({1});
  CHECK(refusal(b) == "tools.1.input_schema: expected an object (a JSON Schema), got array");
}

TEST_CASE("a system block's text and a thinking block's thinking that are no string are named, never read as empty") {
  json b = {{"model", "m"}, {"messages", json::array({{{"role", "user"}, {"content", "x"}}})},
            {"system", json::array({{{"type", "text"}, {"text", "You are terse."}}, {{"type", "text"}, {"text", 5}, {"cache_control", {{"type", "ephemeral"}}}}})}};
  CHECK(refusal(b) == "system.1.text: expected a string, got number");
  json a = {{"model", "m"}, {"messages", json::array({{{"role", "user"}, {"content", "x"}},
                                                      {{"role", "assistant"}, {"content", json::array({{{"type", "thinking"}, {"thinking", json::array()}, {"signature", "s"}},
                                                                                                        {{"type", "text"}, {"text", "ok"}}})}}})}};
  CHECK(refusal(a) == "messages.1.content.0.thinking: expected a string, got array");
}

TEST_CASE("thinking.budget_tokens that is no positive integer is refused, never served without the budget") {
  json b = {{"model", "m"}, {"messages", json::array({{{"role", "user"}, {"content", "x"}}})}};
  b["thinking"] = {{"type", "enabled"}, {"budget_tokens", -5}};
  CHECK(refusal(b) == "thinking.budget_tokens: expected a positive integer, got -5");
  b["thinking"]["budget_tokens"] = 0;
  CHECK(refusal(b) == "thinking.budget_tokens: expected a positive integer, got 0");
  b["thinking"]["budget_tokens"] = 1024.5;
  CHECK(refusal(b) == "thinking.budget_tokens: expected a positive integer, got 1024.5");
  b["thinking"]["budget_tokens"] = "2048";
  CHECK(refusal(b) == "thinking.budget_tokens: expected a positive integer, got \"2048\"");
  b["thinking"]["budget_tokens"] = json::parse("18446744073709551615");
  CHECK(refusal(b) == "thinking.budget_tokens: expected a positive integer, got 18446744073709551615");
}

TEST_CASE("a message that is no object, or a role or content of the wrong type, is refused naming what was read") {
  auto with = [](json msg) { return json{{"model", "m"}, {"messages", json::array({{{"role", "user"}, {"content", "x"}}, msg})}}; };
  CHECK(refusal(with(5)) == "messages.1: expected a message object with \"role\" and \"content\", got number");
  CHECK(refusal(with("hi")) == "messages.1: expected a message object with \"role\" and \"content\", got string");
  CHECK(refusal(with({{"role", 7}, {"content", "x"}})) == "messages.1.role: expected \"user\" or \"assistant\", got number");
  CHECK(refusal(with({{"content", "x"}})) == "messages.1.role: expected \"user\" or \"assistant\", got nothing");
  CHECK(refusal(with({{"role", "user"}, {"content", json::object()}})) ==
        "messages.1.content: expected a string or an array of blocks, got object");
  CHECK(refusal(with({{"role", "user"}})) == "messages.1.content: expected a string or an array of blocks, got nothing");
  // An unknown role is quoted cut, so a huge one cannot make a huge error.
  const std::string why = refusal(with({{"role", std::string(100000, 'r')}, {"content", "x"}}));
  CHECK(why.find("messages.1.role: expected \"user\" or \"assistant\", got \"rrrr") == 0);
  CHECK(why.size() < 200);
}
