// gateway/server/stream_normalizer: recorded upstream chunk sequences in, exact events out.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/sse.hpp"
#include "gateway/server/stream_normalizer.hpp"

using nlohmann::json;
using servedeck::gateway::StreamEnd;
using servedeck::gateway::StreamNormalizer;

namespace {

/// Feeds `chunks` (JSON texts) then finish(); returns the emitted events' data.
struct Run {
  std::vector<std::string> data;
  StreamEnd end = StreamEnd::none;
  std::vector<json> json_events() const {
    std::vector<json> out;
    for (const auto& d : data)
      if (d != "[DONE]") out.push_back(json::parse(d));
    return out;
  }
};

Run run(const std::vector<std::string>& chunks, bool include_usage = false, bool call_finish = true) {
  StreamNormalizer n({"glm53-flash-low", include_usage, true, "seed"});
  std::string out;
  for (const auto& c : chunks) n.on_chunk(json::parse(c), out);
  Run r;
  if (call_finish) r.end = n.finish(out);
  servedeck::sse::Parser p;
  for (auto& e : p.feed(out)) r.data.push_back(e.data);
  return r;
}

const char* role = R"({"id":"c1","object":"chat.completion.chunk","created":7,"model":"glm","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]})";
std::string content(const std::string& text, const char* finish = "null") {
  return R"({"id":"c1","object":"chat.completion.chunk","created":7,"model":"glm","choices":[{"index":0,"delta":{"content":")" +
         text + R"("},"finish_reason":)" + finish + "}]}";
}
const char* usage_tail = R"({"id":"c1","object":"chat.completion.chunk","created":7,"model":"glm","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":2,"total_tokens":7}})";

}  // namespace

TEST_CASE("clean stream: content chunks finish null, one finish chunk, [DONE] last") {
  auto r = run({role, content("Hel"), content("lo"), R"({"id":"c1","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]})", usage_tail});
  REQUIRE(r.data.size() == 5);
  auto ev = r.json_events();
  CHECK(ev[0]["choices"][0]["delta"] == json{{"role", "assistant"}});  // empty content dropped
  CHECK(ev[0]["model"] == "glm53-flash-low");                          // the id the client sent
  CHECK(ev[1]["choices"][0]["delta"]["content"] == "Hel");
  CHECK(ev[1]["choices"][0]["finish_reason"].is_null());
  CHECK(ev[2]["choices"][0]["delta"]["content"] == "lo");
  CHECK(ev[3]["choices"][0]["finish_reason"] == "stop");
  CHECK(ev[3]["choices"][0]["delta"] == json::object());
  CHECK_FALSE(ev[3].contains("usage"));
  CHECK(r.data[4] == "[DONE]");
  CHECK(r.end == StreamEnd::done);
}

TEST_CASE("G21a: finish on the last content chunk, then a usage-only tail") {
  std::vector<std::string> in = {role, content("Hi", "\"stop\""), usage_tail};
  SUBCASE("usage not asked: stripped") {
    auto r = run(in);
    REQUIRE(r.data.size() == 4);
    auto ev = r.json_events();
    CHECK(ev[1]["choices"][0]["delta"]["content"] == "Hi");
    CHECK(ev[1]["choices"][0]["finish_reason"].is_null());
    CHECK(ev[2]["choices"][0]["finish_reason"] == "stop");
    CHECK(r.data[3] == "[DONE]");
  }
  SUBCASE("usage asked: after the finish chunk, before [DONE]") {
    auto r = run(in, true);
    REQUIRE(r.data.size() == 5);
    auto ev = r.json_events();
    CHECK(ev[2]["choices"][0]["finish_reason"] == "stop");
    CHECK(ev[3]["choices"] == json::array());
    CHECK(ev[3]["usage"]["completion_tokens"] == 2);
    CHECK(r.data[4] == "[DONE]");
  }
}

TEST_CASE("G21b: last chunk finish null then [DONE] gets a supplied finish") {
  auto r = run({role, content("x")});
  REQUIRE(r.data.size() == 4);
  CHECK(r.json_events()[2]["choices"][0]["finish_reason"] == "stop");
  auto t = run({R"({"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"f","arguments":"{}"}}]}}]})"});
  CHECK(t.json_events().back()["choices"][0]["finish_reason"] == "tool_calls");
}

TEST_CASE("G10: tool-call deltas get one string id, type and name, later ones omit them") {
  const std::string first = R"({"choices":[{"index":0,"delta":{"tool_calls":[{"id":"call_8c1f","type":"function","index":0,"function":{"name":"calculator","arguments":"{"}}]}}]})";
  const std::string later = R"({"choices":[{"index":0,"delta":{"tool_calls":[{"id":"","type":"function","index":0,"function":{"name":"","arguments":"\"expression\": \"1+1\"}"}}]}}]})";
  SUBCASE("empty id and name on later deltas are dropped") {
    auto ev = run({first, later}).json_events();
    REQUIRE(ev.size() == 3);
    auto a = ev[0]["choices"][0]["delta"]["tool_calls"][0];
    CHECK(a["id"] == "call_8c1f");
    CHECK(a["type"] == "function");
    CHECK(a["function"]["name"] == "calculator");
    CHECK(a["function"]["arguments"] == "{");
    auto b = ev[1]["choices"][0]["delta"]["tool_calls"][0];
    CHECK_FALSE(b.contains("id"));
    CHECK_FALSE(b.contains("type"));
    CHECK_FALSE(b["function"].contains("name"));
    CHECK(b["function"]["arguments"] == "\"expression\": \"1+1\"}");
    CHECK(b["index"] == 0);
  }
  SUBCASE("missing or numeric id: a generated call_<hex>, stable for the stream") {
    for (const char* id_part : {R"("index":0,)", R"("id":17,"index":0,)", R"("id":"123","index":0,)", R"("id":null,"index":0,)"}) {
      std::string f = std::string(R"({"choices":[{"index":0,"delta":{"tool_calls":[{)") + id_part +
                      R"("function":{"name":"calculator","arguments":"{"}}]}}]})";
      auto ev1 = run({f, later}).json_events();
      auto ev2 = run({f, later}).json_events();
      std::string id = ev1[0]["choices"][0]["delta"]["tool_calls"][0]["id"];
      CHECK(id.rfind("call_", 0) == 0);
      CHECK(id.size() == 5 + 24);
      CHECK(id == ev2[0]["choices"][0]["delta"]["tool_calls"][0]["id"]);
      CHECK(ev1[0]["choices"][0]["delta"]["tool_calls"][0]["type"] == "function");
      CHECK_FALSE(ev1[1]["choices"][0]["delta"]["tool_calls"][0].contains("id"));
    }
  }
  SUBCASE("two calls in one stream get distinct ids") {
    const std::string second = R"({"choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"function":{"name":"grep","arguments":"{}"}}]}}]})";
    const std::string first_no_id = R"({"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"name":"calc","arguments":"{}"}}]}}]})";
    auto ev = run({first_no_id, second}).json_events();
    CHECK(ev[0]["choices"][0]["delta"]["tool_calls"][0]["id"] != ev[1]["choices"][0]["delta"]["tool_calls"][0]["id"]);
    CHECK(ev[2]["choices"][0]["finish_reason"] == "tool_calls");
  }
}

TEST_CASE("a final chunk re-sending the complete arguments is not forwarded again") {
  auto ev = run({
      R"({"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_a","type":"function","function":{"name":"read","arguments":"{\"file\":"}}]}}]})",
      R"({"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"\"a.txt\"}"}}]}}]})",
      R"({"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_a","type":"function","function":{"name":"read","arguments":"{\"file\":\"a.txt\"}"}}]},"finish_reason":"tool_calls"}]})",
  }).json_events();
  REQUIRE(ev.size() == 3);  // two argument deltas, the finish chunk
  std::string args;
  for (int i = 0; i < 2; ++i) args += ev[i]["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"].get<std::string>();
  CHECK(args == "{\"file\":\"a.txt\"}");
  CHECK(ev[2]["choices"][0]["finish_reason"] == "tool_calls");
}

TEST_CASE("G11: null and empty optional fields are omitted, streamed and not") {
  auto ev = run({R"({"choices":[{"index":0,"delta":{"content":"hi","tool_calls":null,"function_call":null,"refusal":null,"audio":null,"reasoning_content":null},"finish_reason":null}]})"})
                .json_events();
  CHECK(ev[0]["choices"][0]["delta"] == json{{"content", "hi"}});
  json body = json::parse(
      R"({"id":"x","object":"chat.completion","model":"glm","choices":[{"index":0,"message":{"role":"assistant","content":"hi","tool_calls":null,"function_call":null,"refusal":null,"audio":null},"finish_reason":"stop"}]})");
  CHECK(StreamNormalizer::normalize_body(body, "alias", "seed"));
  CHECK(body["choices"][0]["message"] == json{{"role", "assistant"}, {"content", "hi"}});
  CHECK(body["model"] == "alias");
  json empty = json::parse(R"({"choices":[{"index":0,"message":{"role":"assistant","content":"","tool_calls":[]}}]})");
  CHECK_FALSE(StreamNormalizer::normalize_body(empty, "", "seed"));
}

TEST_CASE("G20: reasoning and reasoning_content chunks both count and are never dropped") {
  auto r = run({R"({"choices":[{"index":0,"delta":{"reasoning":"think a"}}]})",
                R"({"choices":[{"index":0,"delta":{"reasoning_content":"think b"}}]})"});
  auto ev = r.json_events();
  REQUIRE(ev.size() == 3);
  CHECK(ev[0]["choices"][0]["delta"]["reasoning"] == "think a");
  CHECK(ev[1]["choices"][0]["delta"]["reasoning_content"] == "think b");
  CHECK(r.end == StreamEnd::done);  // reasoning alone is output, not an empty stream
}

TEST_CASE("a stream with no content, reasoning or tool call ends with an error event, no [DONE]") {
  auto r = run({role, R"({"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]})", usage_tail});
  CHECK(r.end == StreamEnd::error);
  REQUIRE_FALSE(r.data.empty());
  CHECK(r.data.back() != "[DONE]");
  auto err = json::parse(r.data.back());
  CHECK(err["error"]["code"] == "empty_stream");
  CHECK(err["error"]["source"] == "engine");
}

TEST_CASE("an engine error object becomes the envelope with source engine") {
  StreamNormalizer n({"m", false, true, "s"});
  std::string out;
  n.on_chunk(json::parse(content("partial")), out);
  n.fail_with_engine_error(json::parse(R"({"code":500,"message":"Context size has been exceeded.","type":"server_error"})"), out);
  n.finish(out);  // no effect after an error
  servedeck::sse::Parser p;
  auto ev = p.feed(out);
  REQUIRE(ev.size() == 2);
  auto e = json::parse(ev[1].data);
  CHECK(e["error"]["message"] == "Context size has been exceeded.");
  CHECK(e["error"]["code"] == "500");
  CHECK(e["error"]["source"] == "engine");
  CHECK(out.find("[DONE]") == std::string::npos);
}

TEST_CASE("text completions: text chunks, one finish chunk") {
  StreamNormalizer n({"m", false, false, "s"});
  std::string out;
  n.on_chunk(json::parse(R"({"id":"cmpl-1","choices":[{"index":0,"text":"ab","finish_reason":"length"}]})"), out);
  n.finish(out);
  servedeck::sse::Parser p;
  auto ev = p.feed(out);
  REQUIRE(ev.size() == 3);
  auto a = json::parse(ev[0].data);
  CHECK(a["object"] == "text_completion");
  CHECK(a["choices"][0]["text"] == "ab");
  CHECK(a["choices"][0]["finish_reason"].is_null());
  CHECK(json::parse(ev[1].data)["choices"][0]["finish_reason"] == "length");
  CHECK(ev[2].data == "[DONE]");
}

TEST_CASE("garbage chunks never throw") {
  StreamNormalizer n({"m", true, true, "s"});
  std::string out;
  for (const char* g : {"[]", "3", "null", R"({"choices":7})", R"({"choices":[1,{"delta":5},{"delta":{"tool_calls":[3,{"function":9}]}}]})",
                        R"({"usage":"x","choices":[{"index":"a","delta":{"content":5}}]})"})
    CHECK_NOTHROW(n.on_chunk(json::parse(g), out));
  CHECK_NOTHROW(n.finish(out));
}

TEST_CASE("what a stream keeps is bounded: past the tool-call or choice bound it ends with stream_too_large") {
  using servedeck::gateway::k_max_stream_choices;
  using servedeck::gateway::k_max_stream_tool_calls;
  auto ends_too_large = [](const std::string& out, std::string_view names) {
    servedeck::sse::Parser p;
    auto ev = p.feed(out);
    REQUIRE_FALSE(ev.empty());
    CHECK(ev.back().data != "[DONE]");
    const auto e = json::parse(ev.back().data);
    CHECK(e["error"]["code"] == "stream_too_large");
    CHECK(e["error"]["message"].get<std::string>().find(names) != std::string::npos);
  };
  SUBCASE("tool-call indexes, one new index a chunk") {
    StreamNormalizer n({"m", false, true, "s"});
    std::string out;
    for (std::size_t i = 0; i <= k_max_stream_tool_calls; ++i) {
      json tc = {{"index", i}, {"id", "call_" + std::to_string(i)}, {"function", {{"name", "f"}, {"arguments", "{}"}}}};
      n.on_chunk(json{{"choices", json::array({{{"index", 0}, {"delta", {{"tool_calls", json::array({tc})}}}}})}}, out);
    }
    CHECK(n.ended() == StreamEnd::error);
    CHECK(n.finish(out) == StreamEnd::error);
    ends_too_large(out, "k_max_stream_tool_calls");
    // Everything below the bound went through: one event per accepted index, then the error.
    servedeck::sse::Parser p;
    CHECK(p.feed(out).size() == k_max_stream_tool_calls + 1);
  }
  SUBCASE("choice indexes, all in one chunk") {
    StreamNormalizer n({"m", false, true, "s"});
    std::string out;
    json choices = json::array();
    for (std::size_t i = 0; i <= k_max_stream_choices; ++i) choices.push_back({{"index", i}, {"delta", {{"content", "x"}}}});
    n.on_chunk(json{{"choices", choices}}, out);
    CHECK(n.ended() == StreamEnd::error);
    ends_too_large(out, "k_max_stream_choices");
    servedeck::sse::Parser p;
    CHECK(p.feed(out).size() == 1);  // the chunk that passed the bound is not forwarded
  }
}
