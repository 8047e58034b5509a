// Engine events that are valid JSON but not completion chunks, and chunks whose choice or
// tool-call indexes are out of range, through the real Gateway (gateway_rig.hpp) on the chat,
// Responses and Messages routes: the stream ends with `engine_bad_event` (a 502 before any
// output), never with [DONE], response.completed or message_stop. Regressions for what a hostile
// fake engine found: such events were dropped and the stream still ended cleanly, and a
// tool-call index of 4294967296 was read as 0 and merged two calls.
#include "tests/gateway/server/gateway_rig.hpp"

#include <algorithm>

#include "common/stream_limits.hpp"
#include "gateway/server/stream_normalizer.hpp"

using namespace servedeck;
using namespace servedeck::test::gateway_rig;
using servedeck::test::sse_script;

namespace {

/// The events a client of /v1/responses or /v1/messages received: SSE `event:` names and data.
struct NamedEvents {
  int status = 0;
  std::vector<std::string> types;
  std::vector<json> data;
  bool has(const std::string& type) const { return std::find(types.begin(), types.end(), type) != types.end(); }
};

NamedEvents stream_named(Rig& rig, const std::string& path, const json& body) {
  http::ClientRequest r;
  r.port = rig.gw.port();
  r.method = "POST";
  r.target = path;
  r.body = body.dump();
  NamedEvents out;
  sse::Parser p;
  http::fetch_stream(
      r, [&](int s, const std::map<std::string, std::string>&) { out.status = s; },
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

std::string tool_ev(int64_t index, const std::string& id, const std::string& args) {
  return json{{"id", "c1"},
              {"object", "chat.completion.chunk"},
              {"choices", json::array({{{"index", 0},
                                        {"delta",
                                         {{"tool_calls", json::array({{{"index", index},
                                                                       {"id", id},
                                                                       {"type", "function"},
                                                                       {"function", {{"name", "f"}, {"arguments", args}}}}})}}},
                                        {"finish_reason", nullptr}}})}}
      .dump();
}

std::string choice_ev(const std::string& index) {
  return R"({"id":"c1","choices":[{"index":)" + index + R"(,"delta":{"content":"extra"},"finish_reason":null}]})";
}

/// The client's stream ended with an engine_bad_event error event (no [DONE]) whose message
/// holds `says`, and the request log has it.
void check_bad_event_after_output(Rig& rig, const Received& r, const std::string& says) {
  CAPTURE(r.data);
  CHECK(r.status == 200);
  CHECK_FALSE(r.done());
  REQUIRE_FALSE(r.data.empty());
  const json e = r.event(r.data.size() - 1);
  CHECK(e["error"]["code"] == "engine_bad_event");
  CHECK(e["error"]["message"].get<std::string>().find(says) != std::string::npos);
  // Nothing after the bad event reached the client (the error itself may quote it).
  for (std::size_t i = 0; i + 1 < r.data.size(); ++i) CHECK(r.data[i].find("LOST") == std::string::npos);
  REQUIRE(wait_for([&] { return rig.store.count_requests("/v1/chat/completions") == 1; }));
  CHECK(rig.store.recent_requests(1)[0].error_code == "engine_bad_event");
}

const char* const k_not_chunks[] = {"[1,2,3]", "42", "null", R"("str")",
                                    R"({"choices":{"index":0,"delta":{"content":"LOST"}}})"};

}  // namespace

TEST_CASE("an engine event that is JSON but not a chunk ends the chat stream with engine_bad_event, never [DONE]") {
  for (const char* bad : k_not_chunks) {
    CAPTURE(bad);
    Rig rig;
    rig.engine.push(sse_script({role_ev(), content_ev("Hel"), bad, content_ev("LOST"), finish_ev(), "[DONE]"}, 5));
    auto r = stream(rig, chat());
    REQUIRE(r.data.size() >= 2);
    CHECK(r.event(1)["choices"][0]["delta"]["content"] == "Hel");
    check_bad_event_after_output(rig, r, "expected a chat.completion.chunk: a JSON object with a \"choices\" array");
  }
}

TEST_CASE("the same event before any output is a 502 engine_bad_event naming what was read") {
  Rig rig;
  rig.engine.push(sse_script({role_ev(), "[1,2,3]", content_ev("LOST"), finish_ev(), "[DONE]"}, 5));
  auto r = rig.post("/v1/chat/completions", chat());
  CHECK(r.status == 502);
  const json e = json::parse(r.body);
  CHECK(e["error"]["code"] == "engine_bad_event");
  CHECK(e["error"]["message"].get<std::string>().find("read '[1,2,3]' (array)") != std::string::npos);
}

TEST_CASE("a tool-call index of 4294967296 is refused, not read as 0 and merged into call 0") {
  Rig rig;
  rig.engine.push(sse_script({role_ev(), tool_ev(0, "call_a", R"({"x":1})"), tool_ev(4294967296, "call_b", R"({"y":2})"),
                              finish_ev(), "[DONE]"},
                             9));
  auto r = stream(rig, chat());
  check_bad_event_after_output(rig, r, "choices[0].delta.tool_calls[0].index = '4294967296' (number); expected an integer in [0, " +
                                           std::to_string(gateway::k_max_stream_tool_calls) + ")");
  for (const auto& d : r.data) CHECK(d.find("\"y\"") == std::string::npos);
}

TEST_CASE("tool-call indexes 1000000000, -1 and 1e18 are refused; 0 and 1 make two calls") {
  for (const char* index : {"1000000000", "-1", "1e18"}) {
    CAPTURE(index);
    Rig rig;
    std::string ev = tool_ev(7, "call_b", "{}");
    ev.replace(ev.find("\"index\":7"), 9, std::string("\"index\":") + index);
    rig.engine.push(sse_script({role_ev(), content_ev("Hel"), ev, finish_ev(), "[DONE]"}, 9));
    check_bad_event_after_output(rig, stream(rig, chat()), "choices[0].delta.tool_calls[0].index = '");
  }
  Rig rig;
  rig.engine.push(sse_script({role_ev(), tool_ev(0, "call_a", "{}"), tool_ev(1, "call_b", "{}"), finish_ev(), "[DONE]"}, 9));
  auto r = stream(rig, chat());
  CHECK(r.done());
  int headers = 0;
  for (std::size_t i = 0; i + 1 < r.data.size(); ++i) {
    const json e = r.event(i);
    for (const auto& c : e["choices"])
      if (c.contains("delta") && c["delta"].contains("tool_calls"))
        for (const auto& tc : c["delta"]["tool_calls"]) headers += tc.contains("id") ? 1 : 0;
  }
  CHECK(headers == 2);
}

TEST_CASE("a choice index outside [0, n) is refused: -7 and 1e18 for n = 1, 2 for n = 2; 1 is fine for n = 2") {
  for (const char* index : {"-7", "1e18", "1"}) {
    CAPTURE(index);
    Rig rig;
    rig.engine.push(sse_script({role_ev(), content_ev("Hel"), choice_ev(index), finish_ev(), "[DONE]"}, 9));
    check_bad_event_after_output(rig, stream(rig, chat()), "expected an integer in [0, 1) (the request's n)");
  }
  {
    Rig rig;
    rig.engine.push(sse_script({role_ev(), content_ev("Hel"), choice_ev("2"), finish_ev(), "[DONE]"}, 9));
    check_bad_event_after_output(rig, stream(rig, chat("glm53-flash", true, R"(,"n":2)")), "[0, 2)");
  }
  Rig rig;
  rig.engine.push(sse_script({role_ev(), content_ev("Hel"), choice_ev("1"), finish_ev(), "[DONE]"}, 9));
  auto r = stream(rig, chat("glm53-flash", true, R"(,"n":2)"));
  CHECK(r.done());
  CHECK(r.event(r.data.size() - 2)["choices"].size() == 2);  // one finish per choice
}

TEST_CASE("/v1/responses: an event that is not a chunk ends with response.failed, never response.completed") {
  for (const char* bad : k_not_chunks) {
    CAPTURE(bad);
    Rig rig;
    rig.engine.push(sse_script({role_ev(), content_ev("Hel"), bad, content_ev("LOST"), finish_ev(), "[DONE]"}, 5));
    auto got = stream_named(rig, "/v1/responses", {{"model", "glm53-flash"}, {"input", "hi"}, {"stream", true}});
    CAPTURE(got.types);
    CHECK(got.status == 200);
    REQUIRE_FALSE(got.types.empty());
    CHECK(got.types.back() == "response.failed");
    CHECK_FALSE(got.has("response.completed"));
    CHECK(got.data.back()["response"]["error"]["code"] == "engine_bad_event");
  }
}

TEST_CASE("/v1/messages: an event that is not a chunk ends with an error event, never message_stop") {
  for (const char* bad : k_not_chunks) {
    CAPTURE(bad);
    Rig rig;
    rig.engine.push(sse_script({role_ev(), content_ev("Hel"), bad, content_ev("LOST"), finish_ev(), "[DONE]"}, 5));
    auto got = stream_named(rig, "/v1/messages",
                            {{"model", "glm53-flash"}, {"max_tokens", 64}, {"stream", true},
                             {"messages", json::array({{{"role", "user"}, {"content", "hi"}}})}});
    CAPTURE(got.types);
    CHECK(got.status == 200);
    REQUIRE_FALSE(got.types.empty());
    CHECK(got.types.back() == "error");
    CHECK_FALSE(got.has("message_stop"));
    CHECK(got.data.back()["error"]["message"].get<std::string>().find("a JSON object with a \"choices\" array") !=
          std::string::npos);
  }
}

TEST_CASE("/v1/messages: tool-call arguments past k_max_stream_text_bytes end with an error event naming the bound") {
  // An engine that streams one call's arguments without end, 1 MiB a fragment: the stream ends
  // naming the bound once the arguments pass it, instead of holding them all (chat's
  // stream_too_large for the same stream: tests/policies/response_test.cpp).
  const std::string fragment(std::size_t{1} << 20, 'x');
  std::vector<std::string> events = {role_ev(), tool_ev(0, "call_a", "{\"content\": \"")};
  for (std::size_t sent = 0; sent <= k_max_stream_text_bytes; sent += fragment.size())
    events.push_back(json{{"id", "c1"},
                          {"choices", json::array({{{"index", 0},
                                                    {"delta", {{"tool_calls", json::array({{{"index", 0},
                                                                                            {"function", {{"arguments", fragment}}}}})}}},
                                                    {"finish_reason", nullptr}}})}}
                         .dump());
  events.push_back(content_ev("LOST"));
  events.push_back(finish_ev());
  events.push_back("[DONE]");
  Rig rig;
  rig.engine.push(sse_script(events, std::size_t{1} << 20));
  auto got = stream_named(rig, "/v1/messages",
                          {{"model", "glm53-flash"}, {"max_tokens", 64}, {"stream", true},
                           {"messages", json::array({{{"role", "user"}, {"content", "hi"}}})}});
  CAPTURE(got.types.size());
  REQUIRE_FALSE(got.types.empty());
  CHECK(got.types.back() == "error");
  CHECK_FALSE(got.has("message_stop"));
  CHECK(got.data.back()["error"]["message"].get<std::string>().find(
            std::to_string(k_max_stream_text_bytes >> 20) + " MiB") != std::string::npos);
}
