// The Anthropic Messages routes and the output-budget fit through the real Gateway, in front of
// the in-process fake engine (gateway_rig.hpp): streamed and whole answers, endings over a dead
// engine, errors in Anthropic's envelope, count_tokens through /tokenize, the budget fit with
// its header and counter, unserved paths in /metrics, x-api-key, /v1/models in both shapes.
#include "tests/gateway/server/gateway_rig.hpp"

#include "policies/fit_output_budget.hpp"
#include "tests/gateway/cli/cli_run.hpp"

using namespace servedeck;
using namespace servedeck::test::gateway_rig;
using servedeck::test::json_script;
using servedeck::test::sse_script;

namespace {

/// The Messages events a client received (SSE `event:` names) and their data.
struct MessageEvents {
  int status = 0;
  std::map<std::string, std::string> headers;
  std::vector<std::string> types;
  std::vector<json> data;
  std::string joined() const {
    std::string out;
    for (const auto& t : types) out += (out.empty() ? "" : ",") + t;
    return out;
  }
};

MessageEvents stream_messages(Rig& rig, const std::string& body, const std::string& path = "/v1/messages") {
  http::ClientRequest r;
  r.port = rig.gw.port();
  r.method = "POST";
  r.target = path;
  r.body = body;
  MessageEvents out;
  sse::Parser p;
  http::fetch_stream(
      r,
      [&](int s, const std::map<std::string, std::string>& h) {
        out.status = s;
        out.headers = h;
      },
      [&](std::string_view c) {
        for (auto& e : p.feed(c)) {
          if (e.comment) continue;
          out.types.push_back(e.event);
          out.data.push_back(json::parse(e.data, nullptr, false));
        }
        return true;
      });
  return out;
}

json messages_body(const std::string& model, bool stream, json extra = json::object()) {
  json b = {{"model", model}, {"max_tokens", 64}, {"stream", stream},
            {"system", json::array({{{"type", "text"}, {"text", "x-anthropic-billing-header: cc_version=2.1.197; cch=9f3a1;"}},
                                    {{"type", "text"}, {"text", "You are terse."}}})},
            {"messages", json::array({{{"role", "user"}, {"content", "weather in Paris?"}}})}};
  for (auto& [k, v] : extra.items()) b[k] = v;
  return b;
}

std::string reasoning_ev(const std::string& t) {
  return R"({"id":"c1","object":"chat.completion.chunk","created":1,"model":"glm53-flash","choices":[{"index":0,"delta":{"reasoning_content":")" + t + R"("},"finish_reason":null}]})";
}
std::string tool_ev(const std::string& fn) {
  return R"({"id":"c1","object":"chat.completion.chunk","created":1,"model":"glm53-flash","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,)" + fn + "}]},\"finish_reason\":null}]}";
}

}  // namespace

TEST_CASE("a streamed /v1/messages turn with thinking, text and a tool call: the engine gets the chat translation, the client Anthropic's events") {
  Rig rig;
  rig.engine.push(sse_script({role_ev(), reasoning_ev("Need the tool."), content_ev("Checking."),
                              tool_ev(R"("id":"call_7","type":"function","function":{"name":"get_weather","arguments":"{\"city\":"})"),
                              tool_ev(R"("function":{"arguments":"\"Paris\"}"})"),
                              R"({"id":"c1","choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]})",
                              R"({"id":"c1","choices":[],"usage":{"prompt_tokens":40,"completion_tokens":12,"total_tokens":52}})", "[DONE]"},
                             5));
  json body = messages_body("glm53-flash", true,
                            {{"tools", json::array({{{"name", "get_weather"}, {"input_schema", {{"type", "object"}, {"properties", {{"city", {{"type", "string"}}}}}}}}})}});
  auto got = stream_messages(rig, body.dump());
  CHECK(got.status == 200);
  CHECK(got.headers["request-id"].rfind("req_", 0) == 0);
  CHECK(got.joined() ==
        "message_start,content_block_start,content_block_delta,content_block_delta,content_block_stop,"
        "content_block_start,content_block_delta,content_block_stop,"
        "content_block_start,content_block_delta,content_block_delta,content_block_stop,message_delta,message_stop");
  REQUIRE(got.data.size() == 14);
  CHECK(got.data[1]["content_block"]["type"] == "thinking");
  CHECK(got.data[2]["delta"] == json{{"type", "thinking_delta"}, {"thinking", "Need the tool."}});
  CHECK(got.data[3]["delta"]["type"] == "signature_delta");
  CHECK(got.data[8]["content_block"] == json{{"type", "tool_use"}, {"id", "call_7"}, {"name", "get_weather"}, {"input", json::object()}});
  CHECK(got.data[12]["delta"]["stop_reason"] == "tool_use");
  CHECK(got.data[12]["usage"]["input_tokens"] == 40);
  CHECK(got.data[12]["usage"]["output_tokens"] == 12);
  const json sent = rig.engine.last_body();
  CHECK(sent["model"] == "glm53-flash");
  CHECK(sent["messages"][0] == json{{"role", "system"}, {"content", "You are terse."}});  // billing header removed
  CHECK(sent["tools"][0]["function"]["name"] == "get_weather");
  CHECK(sent["max_tokens"] == 64);
  // Logged under the client's route.
  REQUIRE(wait_for([&] { return !rig.store.recent_requests(10).empty(); }));
  CHECK(rig.store.recent_requests(10)[0].route == "/v1/messages");
}

TEST_CASE("/v1/messages over an engine that dies mid-stream ends with an error event, never message_stop") {
  Rig rig;
  Script s = sse_script({role_ev(), content_ev("Hel"), content_ev("lo")}, 9);
  s.ending = Script::Ending::cut;
  rig.engine.push(s);
  auto got = stream_messages(rig, messages_body("glm53-flash", true).dump());
  CHECK(got.status == 200);
  REQUIRE(!got.types.empty());
  CHECK(got.types.front() == "message_start");
  CHECK(got.types.back() == "error");
  CHECK(std::count(got.types.begin(), got.types.end(), "message_stop") == 0);
  CHECK(got.data.back()["error"]["type"] == "api_error");
}

TEST_CASE("a non-streamed /v1/messages answer, and errors in Anthropic's envelope: unknown model, model not running, bad body") {
  Rig rig;
  rig.engine.push(json_script(200, R"({"id":"c","object":"chat.completion","created":1,"model":"glm53-flash","choices":[{"index":0,"finish_reason":"stop","message":{"role":"assistant","content":"Sunny."}}],"usage":{"prompt_tokens":20,"completion_tokens":2,"total_tokens":22}})"));
  auto ok = rig.post("/v1/messages", messages_body("glm", false).dump());
  CHECK(ok.status == 200);
  json msg = json::parse(ok.body);
  CHECK(msg["type"] == "message");
  CHECK(msg["model"] == "glm");
  CHECK(msg["content"] == json::array({{{"type", "text"}, {"text", "Sunny."}}}));
  CHECK(msg["stop_reason"] == "end_turn");

  auto unknown = rig.post("/v1/messages", messages_body("claude-sonnet-4-5", false).dump());
  CHECK(unknown.status == 404);
  json e = json::parse(unknown.body);
  CHECK(e["type"] == "error");
  CHECK(e["error"]["type"] == "not_found_error");
  CHECK(e["error"]["message"].get<std::string>().find("claude-sonnet-4-5") != std::string::npos);

  auto idle = rig.post("/v1/messages", messages_body("qwen3.8-flash-next", false).dump());
  CHECK(idle.status == 409);
  CHECK(json::parse(idle.body)["error"]["type"] == "invalid_request_error");
  CHECK(json::parse(idle.body)["error"]["message"].get<std::string>().find("servedeck switch qwen") != std::string::npos);

  auto bad = rig.post("/v1/messages", R"({"model":"glm","messages":[]})");
  CHECK(bad.status == 400);
  CHECK(json::parse(bad.body)["error"]["type"] == "invalid_request_error");
  auto notjson = rig.post("/v1/messages", "{");
  CHECK(notjson.status == 400);
  CHECK(json::parse(notjson.body)["type"] == "error");
  auto get = rig.get("/v1/messages");
  CHECK(get.status == 405);
  CHECK(json::parse(get.body)["error"]["type"] == "invalid_request_error");
}

TEST_CASE("count_tokens: the engine's /tokenize count when the model runs, a flagged estimate when it does not") {
  Rig rig;
  rig.engine.push(json_script(200, R"({"count":42,"max_model_len":131072,"tokens":[],"token_strs":null})"));
  auto counted = rig.post("/v1/messages/count_tokens", messages_body("glm53-flash", false).dump());
  CHECK(counted.status == 200);
  CHECK(json::parse(counted.body) == json{{"input_tokens", 42}});
  const json asked = rig.engine.last_body();
  CHECK(asked["model"] == "glm53-flash");
  CHECK(asked["add_generation_prompt"] == true);
  CHECK(asked["messages"][0] == json{{"role", "system"}, {"content", "You are terse."}});

  auto estimated = rig.post("/v1/messages/count_tokens", messages_body("qwen3.8-flash-next", false).dump());
  CHECK(estimated.status == 200);
  json e = json::parse(estimated.body);
  CHECK(e["input_tokens"].get<int64_t>() > 0);
  CHECK(e["servedeck_estimated"] == true);
  CHECK(e["servedeck_estimate_reason"].get<std::string>().find("not running") != std::string::npos);

  Rig fresh;  // the fake engine repeats its last script: a new one for the next answer
  fresh.engine.push(json_script(404, R"({"error":{"message":"no route"}})"));
  auto fallback = fresh.post("/v1/messages/count_tokens", messages_body("glm53-flash", false).dump());
  CHECK(json::parse(fallback.body)["servedeck_estimated"] == true);
  CHECK(json::parse(fallback.body)["servedeck_estimate_reason"].get<std::string>().find("HTTP 404") != std::string::npos);
}

TEST_CASE("fit_output_budget: a budget that cannot fit is lowered to ctx - prompt as /tokenize counts it, said in a header, counted") {
  // Each case on a fresh rig: the fake engine answers its scripts in order and repeats the last.
  const std::string done = R"({"id":"c","object":"chat.completion","created":1,"model":"qwen3.8-flash-next","choices":[{"index":0,"finish_reason":"stop","message":{"role":"assistant","content":"ok"}}],"usage":{"prompt_tokens":1000,"completion_tokens":1,"total_tokens":1001}})";
  {
    Rig rig("qwen");  // ctx 16384
    rig.engine.push(json_script(200, R"({"count":1000})"));
    rig.engine.push(json_script(200, done));
    auto r = rig.post("/v1/chat/completions", chat("qwen3.8-flash-next", false, R"(,"max_tokens":32000)"));
    CHECK(r.status == 200);
    CHECK(rig.engine.requests() == 2);  // /tokenize, then the completion
    CHECK(rig.engine.last_body()["max_tokens"] == 15384);
    CHECK(r.headers[policies::k_output_budget_header].find("max_tokens 32000 -> 15384") != std::string::npos);
    CHECK(r.headers[policies::k_output_budget_header].find("/tokenize") != std::string::npos);
    CHECK(rig.gw.metrics().repairs("fit_output_budget", "qwen") == 1);
  }
  {
    // pi's max_completion_tokens on a streamed request; the header comes with the stream.
    Rig rig("qwen");
    rig.engine.push(json_script(200, R"({"count":1200})"));
    rig.engine.push(sse_script({role_ev(), content_ev("ok"), finish_ev(), "[DONE]"}));
    auto s = stream_messages(rig, chat("qwen3.8-flash-next", true, R"(,"max_completion_tokens":16384)"), "/v1/chat/completions");
    CHECK(s.status == 200);
    CHECK(rig.engine.last_body()["max_completion_tokens"] == 15184);
    CHECK(s.headers[policies::k_output_budget_header].find("max_completion_tokens 16384 -> 15184") != std::string::npos);
  }
  {
    // Never below the floor (256): with no room left the engine's own refusal answers.
    Rig rig("qwen");
    rig.engine.push(json_script(200, R"({"count":16300})"));
    rig.engine.push(json_script(200, done));
    rig.post("/v1/chat/completions", chat("qwen3.8-flash-next", false, R"(,"max_tokens":16000)"));
    CHECK(rig.engine.last_body()["max_tokens"] == 256);
  }
  {
    // A budget that fits is not counted at all: one request to the engine.
    Rig rig("qwen");
    rig.engine.push(json_script(200, done));
    rig.post("/v1/chat/completions", chat("qwen3.8-flash-next", false, R"(,"max_tokens":100)"));
    CHECK(rig.engine.requests() == 1);
    CHECK(rig.engine.last_body()["max_tokens"] == 100);
  }
  {
    // /tokenize fails: the (over)estimate stands in, and the header says so.
    Rig rig("qwen");
    rig.engine.push(json_script(404, R"({"error":{"message":"no /tokenize"}})"));
    rig.engine.push(json_script(200, done));
    auto est = rig.post("/v1/chat/completions", chat("qwen3.8-flash-next", false, R"(,"max_tokens":32000)"));
    CHECK(est.status == 200);
    const int64_t lowered = rig.engine.last_body()["max_tokens"].get<int64_t>();
    CHECK(lowered < 16384);
    CHECK(lowered > 16000);
    CHECK(est.headers[policies::k_output_budget_header].find("estimated") != std::string::npos);
  }
}

TEST_CASE("fit_output_budget applies on /v1/messages too (Claude Code's max_tokens 32000), and can be switched off per model") {
  Rig rig("qwen");
  rig.engine.push(json_script(200, R"({"count":3000})"));
  rig.engine.push(sse_script({role_ev(), content_ev("hi"), finish_ev(), "[DONE]"}));
  auto got = stream_messages(rig, messages_body("qwen3.8-flash-next", true, {{"max_tokens", 32000}}).dump());
  CHECK(got.status == 200);
  CHECK(got.types.back() == "message_stop");
  CHECK(rig.engine.last_body()["max_tokens"] == 13384);
  CHECK(got.headers[policies::k_output_budget_header].find("32000 -> 13384") != std::string::npos);

  Rig off("qwen", 5000, [](registry::Registry& r) { r.models[1].policies.fit_output_budget = false; });
  off.engine.push(json_script(400, R"({"error":{"message":"prompt + max_tokens > 16384","code":400}})"));
  auto refused = off.post("/v1/messages", messages_body("qwen3.8-flash-next", false, {{"max_tokens", 32000}}).dump());
  CHECK(refused.status == 400);
  CHECK(off.engine.requests() == 1);  // no /tokenize: the policy is off
  CHECK(json::parse(refused.body)["error"]["message"].get<std::string>().find("16384") != std::string::npos);
}

TEST_CASE("requests to unserved paths are counted in /metrics by path, with a bounded label set") {
  Rig rig;
  CHECK(rig.get("/v1/embeddings").status == 404);
  rig.post("/v1/embeddings", "{}");
  rig.get("/api/tags");
  CHECK(rig.gw.metrics().unserved("/v1/embeddings") == 2);
  for (int i = 0; i < 60; ++i) rig.get("/scan/" + std::to_string(i));
  const std::string m = rig.get("/metrics").body;
  CHECK(m.find("servedeck_unserved_requests_total{path=\"/v1/embeddings\"} 2") != std::string::npos);
  CHECK(m.find("servedeck_unserved_requests_total{path=\"/api/tags\"} 1") != std::string::npos);
  std::size_t labels = 0;
  for (auto p = m.find("servedeck_unserved_requests_total{"); p != std::string::npos; p = m.find("servedeck_unserved_requests_total{", p + 1)) ++labels;
  CHECK(labels <= gateway::Metrics::k_max_unserved_paths + 1);
  // 62 distinct paths: the first 32 keep their label, the other 30 count as "other".
  CHECK(rig.gw.metrics().unserved("other") == 62 - static_cast<int64_t>(gateway::Metrics::k_max_unserved_paths));
  CHECK(rig.gw.metrics().unserved("/v1/messages") == 0);
}

TEST_CASE("API keys: Anthropic clients' x-api-key is accepted; a missing key on /v1/messages is Anthropic's 401") {
  Rig rig("glm53", 5000, [](registry::Registry& r) { r.server.api_keys = {"sk-local"}; });
  auto missing = rig.post("/v1/messages", messages_body("glm", false).dump());
  CHECK(missing.status == 401);
  CHECK(json::parse(missing.body)["error"]["type"] == "authentication_error");
  rig.engine.push(json_script(200, R"({"id":"c","object":"chat.completion","created":1,"model":"glm53-flash","choices":[{"index":0,"finish_reason":"stop","message":{"role":"assistant","content":"ok"}}],"usage":{"prompt_tokens":2,"completion_tokens":1,"total_tokens":3}})"));
  auto ok = rig.post("/v1/messages", messages_body("glm", false).dump(), {{"x-api-key", "sk-local"}});
  CHECK(ok.status == 200);
  auto wrong = rig.post("/v1/messages", messages_body("glm", false).dump(), {{"x-api-key", "sk-other"}});
  CHECK(wrong.status == 401);
}

TEST_CASE("/v1/models answers in OpenAI's and Anthropic's shape; /v1/models/{id} finds one or 404s") {
  Rig rig;
  json list = json::parse(rig.get("/v1/models").body);
  CHECK(list["object"] == "list");
  CHECK(list["has_more"] == false);
  CHECK(list["first_id"] == "glm53-flash");
  json first = list["data"][0];
  CHECK(first["object"] == "model");
  CHECK(first["type"] == "model");
  CHECK(first["display_name"] == "glm53-flash");
  CHECK(first["max_model_len"] == 131072);
  auto one = rig.get("/v1/models/glm53-flash-low");
  CHECK(one.status == 200);
  CHECK(json::parse(one.body)["root"] == "glm53-flash");
  http::ClientRequest r;
  r.port = rig.gw.port();
  r.target = "/v1/models/claude-opus-4";
  r.headers = {{"anthropic-version", "2023-06-01"}};
  auto missing = http::fetch(r);
  CHECK(missing.status == 404);
  CHECK(json::parse(missing.body)["error"]["type"] == "not_found_error");
  CHECK(json::parse(rig.get("/v1/models/nope").body)["error"]["code"] == "model_not_found");
}

TEST_CASE("Anthropic's TypeScript SDK: create, stream with thinking, tool use, tool result, countTokens, NotFoundError") {
  Rig rig;
  auto completion = [](const std::string& text) {
    return json_script(200, json{{"id", "c"}, {"object", "chat.completion"}, {"created", 1}, {"model", "glm53-flash"},
                                 {"choices", json::array({{{"index", 0}, {"finish_reason", "stop"},
                                                           {"message", {{"role", "assistant"}, {"content", text}}}}})},
                                 {"usage", {{"prompt_tokens", 12}, {"completion_tokens", 3}, {"total_tokens", 15}}}}.dump());
  };
  const std::string usage = R"({"id":"c1","choices":[],"usage":{"prompt_tokens":30,"completion_tokens":5,"total_tokens":35}})";
  rig.engine.push(completion("Sunny."));
  rig.engine.push(sse_script({role_ev(), reasoning_ev("Let me "), reasoning_ev("think."), content_ev("Hel"), content_ev("lo."),
                              finish_ev(), usage, "[DONE]"}));
  rig.engine.push(sse_script({role_ev(), tool_ev(R"("id":"call_w1","type":"function","function":{"name":"get_weather","arguments":"{\"ci"})"),
                              tool_ev(R"("function":{"arguments":"ty\":\"Paris\"}"})"),
                              R"({"id":"c1","choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]})", usage, "[DONE]"}));
  rig.engine.push(completion("It is sunny in Paris."));
  rig.engine.push(json_script(200, R"({"count":42})"));
  const std::string src = SERVEDECK_SOURCE_DIR;
  const sdtest::Run run = sdtest::cli_cmd("node '" + src + "/tests/gateway/anthropic/anthropic_sdk_client.mjs' 'http://127.0.0.1:" +
                                          std::to_string(rig.gw.port()) + "' glm 2>&1");
  REQUIRE_MESSAGE(run.rc == 0, "node failed: " << run.out);
  CHECK(run.out.find("sdk: all checks passed") != std::string::npos);
  // Four answered turns and the 404, each logged under /v1/messages (count_tokens is not a turn).
  CHECK(wait_for([&] { return rig.store.count_requests("/v1/messages") == 5; }));
  CHECK(rig.engine.last_body()["messages"][0] == json{{"role", "user"}, {"content", "hi"}});  // the /tokenize body
}

TEST_CASE("a long prefill: message_start comes first, then ping events, then the blocks") {
  Rig rig("glm53", 40);  // heartbeat every 40 ms while the engine has produced nothing
  Script s = sse_script({role_ev(), content_ev("late"), finish_ev(), "[DONE]"}, 4096);
  s.pieces.front().delay_ms = 300;
  rig.engine.push(s);
  auto got = stream_messages(rig, messages_body("glm53-flash", true).dump());
  CHECK(got.status == 200);
  REQUIRE(got.types.size() >= 6);
  CHECK(got.types[0] == "message_start");
  CHECK(got.types[1] == "ping");
  CHECK(std::count(got.types.begin(), got.types.end(), "message_start") == 1);
  CHECK(got.types.back() == "message_stop");
  const auto first_block = std::find(got.types.begin(), got.types.end(), "content_block_start");
  REQUIRE(first_block != got.types.end());
  CHECK(std::count(got.types.begin(), first_block, "ping") >= 2);
}

TEST_CASE("effort-preset aliases work on /v1/messages: the preset's kwargs reach the engine, the alias is echoed") {
  Rig rig;
  rig.engine.push(json_script(200, R"({"id":"c","object":"chat.completion","created":1,"model":"glm53-flash","choices":[{"index":0,"finish_reason":"stop","message":{"role":"assistant","content":"ok"}}],"usage":{"prompt_tokens":2,"completion_tokens":1,"total_tokens":3}})"));
  auto r = rig.post("/v1/messages", messages_body("glm53-flash-high", false, {{"thinking", {{"type", "disabled"}}}}).dump());
  CHECK(r.status == 200);
  CHECK(json::parse(r.body)["model"] == "glm53-flash-high");
  const json sent = rig.engine.last_body();
  CHECK(sent["model"] == "glm53-flash");
  CHECK(sent["chat_template_kwargs"]["reasoning_effort"] == "high");
  CHECK(sent["chat_template_kwargs"]["enable_thinking"] == false);  // the client's thinking switch
}

TEST_CASE("/v1/messages: a very long unknown model id is quoted cut in the 404 and in the request log") {
  Rig rig;
  auto r = rig.post("/v1/messages", messages_body(std::string(2000, 'q'), false).dump());
  CHECK(r.status == 404);
  const auto m = json::parse(r.body)["error"]["message"].get<std::string>();
  CHECK_MESSAGE(m.find(std::string(128, 'q') + "\xE2\x80\xA6 (2000 bytes)") != std::string::npos, m);
  CHECK(m.find(std::string(129, 'q')) == std::string::npos);
  REQUIRE(wait_for([&] { return rig.store.count_requests("/v1/messages") == 1; }));
  CHECK(rig.store.recent_requests(1)[0].alias.size() < 200);
}

TEST_CASE("an engine answer the Messages bridge cannot translate is 502 to the client and 502 in the request log") {
  Rig rig;
  // Tool arguments that are JSON but no object: no Anthropic `input` can carry them.
  rig.engine.push(json_script(200, R"({"id":"c","object":"chat.completion","created":1,"model":"glm53-flash","choices":[{"index":0,"finish_reason":"tool_calls","message":{"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"[1,2]"}}]}}]})"));
  auto r = rig.post("/v1/messages", messages_body("glm", false).dump());
  CHECK(r.status == 502);
  CHECK(json::parse(r.body)["error"]["type"] == "api_error");
  REQUIRE(wait_for([&] { return rig.store.count_requests("/v1/messages") == 1; }));
  const auto rows = rig.store.recent_requests(1);
  REQUIRE(rows.size() == 1);
  CHECK(rows[0].status == 502);
  CHECK(rows[0].error_code == "untranslatable_answer");
}
