// tool_choice enforced by forcing the answer's start (worker/server/tool_choice.hpp): the
// parse and the forced prefix per format, then over HTTP with the fake model — named and
// required calls streamed and not, a prompt that leaves <think> open, glm, a model that ignores
// the forced start, and the 400s for bad shapes, unknown names and a format that cannot be forced.
#include <doctest/doctest.h>

#include "tests/worker/server/server_fixture.hpp"
#include "worker/server/chat_prompt.hpp"
#include "worker/server/tool_choice.hpp"

using namespace servedeck;
using namespace servedeck::worker;
using namespace servedeck::worker::testing;
using nlohmann::json;

namespace {

const json k_two_tools = json::parse(R"([
  {"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}},
  {"type":"function","function":{"name":"get_time","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}])");

json named(const std::string& name) { return {{"type", "function"}, {"function", {{"name", name}}}}; }

// The chat answer as one message, from a non-streamed body or by folding a stream's chunks.
struct Answer {
  std::string content, reasoning, finish;
  std::vector<std::pair<std::string, std::string>> calls;  // name, arguments text
  int prompt_tokens = -1;
};

Answer from_message(const json& j) {
  Answer a;
  const auto& m = j["choices"][0]["message"];
  if (m["content"].is_string()) a.content = m["content"];
  if (m.contains("reasoning_content")) a.reasoning = m["reasoning_content"];
  if (m.contains("tool_calls"))
    for (const auto& c : m["tool_calls"]) a.calls.emplace_back(c["function"]["name"], c["function"]["arguments"]);
  a.finish = j["choices"][0]["finish_reason"];
  a.prompt_tokens = j["usage"]["prompt_tokens"];
  return a;
}

Answer from_stream(const std::vector<std::string>& events) {
  Answer a;
  REQUIRE(!events.empty());
  CHECK(events.back() == "[DONE]");
  for (const auto& e : events) {
    if (e == "[DONE]") continue;
    const auto j = json::parse(e);
    if (j.contains("usage") && j["usage"].is_object()) a.prompt_tokens = j["usage"]["prompt_tokens"];
    if (j["choices"].empty()) continue;
    const auto& c = j["choices"][0];
    if (c["finish_reason"].is_string()) a.finish = c["finish_reason"];
    const auto& d = c["delta"];
    if (d.contains("content")) a.content += d["content"].get<std::string>();
    if (d.contains("reasoning_content")) a.reasoning += d["reasoning_content"].get<std::string>();
    if (d.contains("tool_calls")) {
      const auto& tc = d["tool_calls"][0];
      const auto index = tc["index"].get<std::size_t>();
      if (tc["function"].contains("name")) {
        CHECK(index == a.calls.size());
        a.calls.emplace_back(tc["function"]["name"], "");
      }
      REQUIRE(index < a.calls.size());
      a.calls[index].second += tc["function"]["arguments"].get<std::string>();
    }
  }
  return a;
}

// Runs the chat both ways and checks they agree; returns the non-streamed answer.
Answer chat_both(const Fixture& f, const std::string& user, const json& extra) {
  const auto r = f.post("/v1/chat/completions", chat_body(user, false, extra).dump());
  REQUIRE(r.status == 200);
  const Answer whole = from_message(json::parse(r.body));
  json sextra = extra;
  sextra["stream_options"] = {{"include_usage", true}};
  int status = 0;
  const Answer streamed = from_stream(f.stream("/v1/chat/completions", chat_body(user, true, sextra).dump(), &status));
  CHECK(status == 200);
  CHECK(streamed.content == whole.content);
  CHECK(streamed.reasoning == whole.reasoning);
  CHECK(streamed.calls == whole.calls);
  CHECK(streamed.finish == whole.finish);
  CHECK(streamed.prompt_tokens == whole.prompt_tokens);
  return whole;
}

// The prompt's size per /tokenize (the template only) plus the forced text's tokens.
int expected_prompt_tokens(const Fixture& f, const std::string& user, const json& extra, const std::string& forced) {
  const auto t = json::parse(f.post("/tokenize", chat_body(user, false, extra).dump()).body);
  return t["count"].get<int>() + static_cast<int>(FakeTextModel().encode(forced).size());
}

// The 400 for a chat request, streamed and not: checks the envelope names tool_choice with
// `code` (both ways alike) and returns the message.
std::string refused(const Fixture& f, const json& extra, const std::string& code = "invalid_tool_choice") {
  const auto r = f.post("/v1/chat/completions", chat_body("pick a tool", false, extra).dump());
  CHECK(r.status == 400);
  const auto s = f.post("/v1/chat/completions", chat_body("pick a tool", true, extra).dump());
  CHECK(s.status == 400);
  const auto j = json::parse(r.body);
  CHECK(j["error"]["type"] == "invalid_request_error");
  CHECK(j["error"]["param"] == "tool_choice");
  CHECK(j["error"]["code"] == code);
  CHECK(json::parse(s.body) == j);
  return j["error"]["message"];
}

}  // namespace

TEST_CASE("parse_tool_choice and the forced prefix per format") {
  ToolChoice c;
  CHECK(!parse_tool_choice(json::object(), k_two_tools, c));
  CHECK(c.mode == ToolChoiceMode::automatic);
  CHECK(!parse_tool_choice({{"tool_choice", "required"}}, k_two_tools, c));
  CHECK(c.mode == ToolChoiceMode::required);
  CHECK(!parse_tool_choice({{"tool_choice", named("get_time")}}, k_two_tools, c));
  CHECK(c.mode == ToolChoiceMode::named);
  CHECK(c.name == "get_time");
  std::string p;
  CHECK(!forced_tool_call_prefix(c, ToolParserKind::hermes, false, p));
  CHECK(p == "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {");
  CHECK(!forced_tool_call_prefix(c, ToolParserKind::glm, false, p));
  CHECK(p == "<tool_call>get_time\n");
  CHECK(!forced_tool_call_prefix(c, ToolParserKind::qwen3_coder, false, p));
  CHECK(p == "<tool_call>\n<function=get_time>\n");
  CHECK(!forced_tool_call_prefix(c, ToolParserKind::hermes, true, p));
  CHECK(p == "</think>\n\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {");
  c.mode = ToolChoiceMode::required;
  CHECK(!forced_tool_call_prefix(c, ToolParserKind::hermes, false, p));
  CHECK(p == "<tool_call>\n");
  CHECK(!forced_tool_call_prefix(c, ToolParserKind::glm, false, p));
  CHECK(p == "<tool_call>");
  CHECK(!forced_tool_call_prefix(c, ToolParserKind::qwen3_coder, false, p));
  CHECK(p == "<tool_call>\n");
  const auto e = forced_tool_call_prefix(c, ToolParserKind::none, false, p);
  REQUIRE(e);
  CHECK(e->kind == ToolChoiceErrorKind::unsupported);
  CHECK(to_string(e->kind) == "unsupported_tool_choice");
  CHECK(e->message.find("tool_choice 'required' is not supported for this model's tool-call format") == 0);
  c.mode = ToolChoiceMode::automatic;
  CHECK(!forced_tool_call_prefix(c, ToolParserKind::none, true, p));
  CHECK(p.empty());
}

TEST_CASE("tool_choice naming a function forces a call to it, streamed and not") {
  Fixture f;
  const json extra = {{"tools", k_two_tools}, {"tool_choice", named("get_time")}};
  const Answer a = chat_both(f, "pick a tool", extra);
  REQUIRE(a.calls.size() == 1);
  CHECK(a.calls[0].first == "get_time");  // the model alone would call get_weather
  CHECK(json::parse(a.calls[0].second) == json{{"city", "Paris"}});
  CHECK(a.content.empty());
  CHECK(a.finish == "tool_calls");
  CHECK(a.prompt_tokens ==
        expected_prompt_tokens(f, "pick a tool", extra, "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {"));

  // A model that does not go on with the forced call (the scripted "Hello there!" ends at once):
  // the call is still to get_time, its arguments are the forced "{" and what followed (nothing).
  const Answer quiet = chat_both(f, "hi", extra);
  REQUIRE(quiet.calls.size() == 1);
  CHECK(quiet.calls[0].first == "get_time");
  CHECK(quiet.calls[0].second == "{");
  CHECK(quiet.finish == "tool_calls");
}

TEST_CASE("tool_choice required forces a tool call's opening, streamed and not") {
  Fixture f;
  const json extra = {{"tools", k_two_tools}, {"tool_choice", "required"}};
  const Answer a = chat_both(f, "pick a tool", extra);
  REQUIRE(a.calls.size() == 1);
  CHECK(a.calls[0].first == "get_weather");
  CHECK(json::parse(a.calls[0].second) == json{{"city", "Paris"}});
  CHECK(a.finish == "tool_calls");
  CHECK(a.prompt_tokens == expected_prompt_tokens(f, "pick a tool", extra, "<tool_call>\n"));

  // Without required the same model answers in text; with it the answer must start as a call.
  CHECK(chat_both(f, "hi", {{"tools", k_two_tools}}).content == "Hello there!");
  // A model that closes its turn right after the forced opening: no call can be parsed, and the
  // markup is released as content (no grammar keeps the model inside the call).
  const Answer quiet = chat_both(f, "hi", extra);
  CHECK(quiet.calls.empty());
  CHECK(quiet.content == "<tool_call>\n");
  CHECK(quiet.finish == "stop");
}

TEST_CASE("a prompt that leaves <think> open: the forced text closes it first") {
  Fixture f;
  const json extra = {{"tools", k_two_tools}, {"tool_choice", "required"}, {"chat_template_kwargs", {{"open_thinking", true}}}};
  const Answer a = chat_both(f, "pick a tool", extra);
  CHECK(a.reasoning.empty());
  REQUIRE(a.calls.size() == 1);
  CHECK(a.calls[0].first == "get_weather");
  CHECK(a.content == "\n\n");  // what follows </think>, as for a model that wrote it
  CHECK(a.finish == "tool_calls");
  CHECK(a.prompt_tokens == expected_prompt_tokens(f, "pick a tool", extra, "</think>\n\n<tool_call>\n"));
}

TEST_CASE("glm format: a named tool_choice forces <tool_call>name") {
  Fixture f(1 << 20, ToolParserKind::glm);
  const Answer a = chat_both(f, "hi", {{"tools", k_two_tools}, {"tool_choice", named("get_time")}});
  REQUIRE(a.calls.size() == 1);
  CHECK(a.calls[0].first == "get_time");
  CHECK(a.calls[0].second == "{}");
  CHECK(a.finish == "tool_calls");
}

TEST_CASE("tool_choice none and auto behave as before") {
  Fixture f;
  const Answer none = chat_both(f, "pick a tool", {{"tools", k_two_tools}, {"tool_choice", "none"}});
  CHECK(none.calls.empty());
  CHECK(none.content.find("<tool_call>") == 0);
  const Answer automatic = chat_both(f, "pick a tool", {{"tools", k_two_tools}, {"tool_choice", "auto"}});
  REQUIRE(automatic.calls.size() == 1);
  CHECK(automatic.calls[0].first == "get_weather");
}

TEST_CASE("bad tool_choice values are 400s naming what was read and what is expected") {
  Fixture f;
  const std::string expected =
      "field 'tool_choice': expected \"auto\", \"none\", \"required\" or {\"type\": \"function\", \"function\": "
      "{\"name\": \"...\"}}, got ";
  CHECK(refused(f, {{"tools", k_two_tools}, {"tool_choice", 5}}) == expected + "5");
  CHECK(refused(f, {{"tools", k_two_tools}, {"tool_choice", "always"}}) == expected + "\"always\"");
  CHECK(refused(f, {{"tools", k_two_tools}, {"tool_choice", {{"type", "function"}}}}) == expected + "{\"type\":\"function\"}");
  const json wrong_type = {{"type", "tool"}, {"function", {{"name", "get_time"}}}};
  CHECK(refused(f, {{"tools", k_two_tools}, {"tool_choice", wrong_type}}) == expected + wrong_type.dump());
  CHECK(refused(f, {{"tools", k_two_tools}, {"tool_choice", named("get_news")}}) ==
        "field 'tool_choice': names the function 'get_news', which is not one of the request's tools ('get_weather', "
        "'get_time')");
  CHECK(refused(f, {{"tool_choice", named("get_time")}}) ==
        "field 'tool_choice': names the function 'get_time', but the request has no 'tools'; expected one of the "
        "request's tools");
  CHECK(refused(f, {{"tool_choice", "required"}}).find("\"required\" needs a non-empty 'tools' array") != std::string::npos);
}

TEST_CASE("a tool-call format that cannot be forced: 400, not silently ignored") {
  Fixture f(1 << 20, ToolParserKind::none);
  CHECK(refused(f, {{"tools", k_two_tools}, {"tool_choice", "required"}}, "unsupported_tool_choice").find(
            "tool_choice 'required' is not supported for this model's tool-call format") == 0);
  CHECK(refused(f, {{"tools", k_two_tools}, {"tool_choice", named("get_time")}}, "unsupported_tool_choice").find(
            "a named tool_choice is not supported for this model's tool-call format") == 0);
  CHECK(chat_both(f, "hi", {{"tools", k_two_tools}, {"tool_choice", "auto"}}).content == "Hello there!");
}

TEST_CASE("a refused tool_choice names its param and code; malformed messages keep invalid_messages") {
  ToolChoice c;
  const auto e = parse_tool_choice({{"tool_choice", "always"}}, k_two_tools, c);
  REQUIRE(e);
  CHECK(e->kind == ToolChoiceErrorKind::invalid);
  CHECK(to_string(e->kind) == "invalid_tool_choice");

  // glm cannot write a name holding a space: a valid choice it cannot enforce.
  const json spaced = json::parse(R"([{"type":"function","function":{"name":"get time"}}])");
  Fixture glm(1 << 20, ToolParserKind::glm);
  const std::string m = refused(glm, {{"tools", spaced}, {"tool_choice", named("get time")}}, "unsupported_tool_choice");
  CHECK(m.find("a named tool_choice: the function name 'get time' cannot be written in the glm tool-call format") == 0);
  ToolChoice spaced_choice;
  spaced_choice.mode = ToolChoiceMode::named;
  spaced_choice.name = "get time";
  std::string unused;
  const auto q = forced_tool_call_prefix(spaced_choice, ToolParserKind::qwen3_coder, false, unused);
  REQUIRE(q);
  CHECK(q->kind == ToolChoiceErrorKind::unsupported);
  CHECK(q->message.find("cannot be written in the qwen3_coder tool-call format") != std::string::npos);

  // /tokenize reads tool_choice too and refuses it the same way.
  Fixture f;
  const auto t = f.post("/tokenize", chat_body("hi", false, {{"tools", k_two_tools}, {"tool_choice", named("get_news")}}).dump());
  CHECK(t.status == 400);
  const auto tj = json::parse(t.body);
  CHECK(tj["error"]["code"] == "invalid_tool_choice");
  CHECK(tj["error"]["param"] == "tool_choice");
  CHECK(tj["error"]["message"].get<std::string>().find("names the function 'get_news'") != std::string::npos);

  // A malformed message is not a tool_choice problem: invalid_messages, no param.
  json body = chat_body("hi", false, {{"tools", k_two_tools}, {"tool_choice", "required"}});
  body["messages"] = json::array({json{{"role", 5}}});
  const auto r = f.post("/v1/chat/completions", body.dump());
  CHECK(r.status == 400);
  const auto rj = json::parse(r.body);
  CHECK(rj["error"]["code"] == "invalid_messages");
  CHECK(rj["error"]["param"].is_null());
}

TEST_CASE("malformed assistant tool_calls are the client's 400, named by path") {
  Fixture f;
  const std::pair<const char*, const char*> cases[] = {
      {R"("x")", "messages[0].tool_calls: expected an array of tool calls, got"},
      {R"([5])", "messages[0].tool_calls[0]: expected {"},
      {R"([{"id":5,"function":{"name":"f"}}])", "messages[0].tool_calls[0].id: expected a string, got"},
      {R"([{"id":"c","function":{"name":null}}])", "messages[0].tool_calls[0].function.name: expected a string, got"},
      {R"([{"id":"c"}])", "messages[0].tool_calls[0].function: expected an object with a string `name`, got nothing"},
      {R"([{"id":"c","function":{"name":"f","arguments":5}}])", "messages[0].tool_calls[0].function.arguments: expected a JSON-encoded string or an object, got"},
  };
  for (const auto& [calls, message] : cases) {
    INFO(calls);
    json body = chat_body("hi", false);
    body["messages"] = json::array({json{{"role", "assistant"}, {"content", nullptr}, {"tool_calls", json::parse(calls)}},
                                    json{{"role", "user"}, {"content", "hi"}}});
    const auto r = f.post("/v1/chat/completions", body.dump());
    CHECK(r.status == 400);
    const auto e = json::parse(r.body)["error"];
    CHECK(e["code"] == "invalid_messages");
    CHECK_MESSAGE(e["message"].get<std::string>().find(message) == 0, e["message"]);
  }
}

namespace {
/// The fake model, recording the context the chat template was given.
class RecordingModel final : public FakeTextModel {
 public:
  std::string render_chat(const json& ctx) const override {
    seen = ctx;
    return FakeTextModel::render_chat(ctx);
  }
  mutable json seen;
};
}  // namespace

TEST_CASE("tool-call arguments reach the template as an object when they are one, within the JSON depth bound") {
  auto body_with = [](const std::string& arguments) {
    json body = chat_body("hi", false);
    body["messages"] = json::array(
        {json{{"role", "assistant"},
              {"content", ""},
              {"tool_calls", json::array({json{{"id", "c"}, {"type", "function"}, {"function", {{"name", "f"}, {"arguments", arguments}}}}})}},
         json{{"role", "user"}, {"content", "hi"}}});
    return body;
  };
  RecordingModel model;
  ChatPrompt out;
  REQUIRE_FALSE(build_chat_prompt(body_with(R"({"city":"Paris"})"), model, out));
  CHECK(model.seen["messages"][0]["tool_calls"][0]["function"]["arguments"] == json{{"city", "Paris"}});
  // A valid object nested 100000 deep: past the bound, so it stays the string it came as (parsed,
  // it would be a 100000-level value for the template to walk and print).
  std::string deep;
  for (int i = 0; i < 100000; ++i) deep += "{\"a\":";
  deep += "1" + std::string(100000, '}');
  REQUIRE_FALSE(build_chat_prompt(body_with(deep), model, out));
  const json& args = model.seen["messages"][0]["tool_calls"][0]["function"]["arguments"];
  CHECK(args.is_string());
  CHECK(args.get<std::string>().size() == deep.size());
}
