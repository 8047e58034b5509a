// What the engine's response head says, through the real Gateway (gateway_rig.hpp): a body the
// proxy cannot read (a Content-Encoding other than identity, a 200 to a streamed request that is
// not text/event-stream) is a 502 `engine_bad_response` that names what was read and what was
// expected, never a 200 with an empty stream; an engine `{"error": …}` sent as JSON to a streamed
// request keeps its own status; a stream whose body ends by its own framing without a finish
// chunk says so instead of an empty "()".
#include "tests/gateway/server/gateway_rig.hpp"

using namespace servedeck;
using namespace servedeck::test::gateway_rig;
using servedeck::test::json_script;
using servedeck::test::sse_script;

namespace {

std::string completion_body() {
  return R"({"id":"c1","object":"chat.completion","created":1,"model":"glm53-flash","choices":[{"index":0,"message":{"role":"assistant","content":"hello"},"finish_reason":"stop"}]})";
}

/// The client got a 502 engine_bad_response whose message holds every one of `says`, and the
/// request log has the code.
void check_bad_response(Rig& rig, const http::ClientResponse& r, std::initializer_list<const char*> says) {
  CAPTURE(r.body);
  CHECK(r.status == 502);
  const json e = json::parse(r.body, nullptr, false);
  REQUIRE(e.is_object());
  CHECK(e["error"]["code"] == "engine_bad_response");
  CHECK(e["error"]["source"] == "engine");
  for (const char* s : says) CHECK(e["error"]["message"].get<std::string>().find(s) != std::string::npos);
  REQUIRE(wait_for([&] { return rig.store.count_requests("/v1/chat/completions") == 1; }));
  CHECK(rig.store.recent_requests(1)[0].error_code == "engine_bad_response");
}

}  // namespace

TEST_CASE("the proxy asks the engine for an identity body; a gzip answer is refused by name, streamed or not") {
  for (bool streamed : {true, false}) {
    CAPTURE(streamed);
    Rig rig;
    auto s = streamed ? sse_script({role_ev(), content_ev("hi"), finish_ev(), "[DONE]"}) : json_script(200, completion_body());
    s.headers = {{"Content-Encoding", "GZip"}};
    rig.engine.push(s);
    auto r = rig.post("/v1/chat/completions", chat("glm53-flash", streamed));
    CHECK(rig.engine.last_accept_encoding() == "identity");
    check_bad_response(rig, r, {"Content-Encoding 'gzip'", "Accept-Encoding: identity"});
  }
}

TEST_CASE("Content-Encoding identity, and text/event-stream with parameters or in capitals, stream as usual") {
  for (const char* type : {"text/event-stream; charset=utf-8", "Text/Event-Stream", " text/event-stream "}) {
    CAPTURE(type);
    Rig rig;
    auto s = sse_script({role_ev(), content_ev("hi"), finish_ev(), "[DONE]"});
    s.content_type = type;
    s.headers = {{"Content-Encoding", "identity"}};
    rig.engine.push(s);
    auto r = stream(rig, chat());
    CHECK(r.status == 200);
    CHECK(r.done());
  }
}

TEST_CASE("a streamed request answered 200 with a JSON completion is a 502 naming the Content-Type and quoting the body") {
  Rig rig;
  rig.engine.push(json_script(200, completion_body()));
  auto r = rig.post("/v1/chat/completions", chat());
  check_bad_response(rig, r, {"Content-Type 'application/json'", "expected text/event-stream", "\"content\":\"hello\""});
  CHECK(r.body.find("()") == std::string::npos);
}

TEST_CASE("a streamed request answered 200 with a text/plain body of any bytes is a 502, bounded and one line") {
  Rig rig;
  std::string junk(100000, 'x');
  junk[3] = '\n';
  junk[5] = '\x01';
  auto s = json_script(200, junk);
  s.content_type = "text/plain";
  rig.engine.push(s);
  auto r = rig.post("/v1/chat/completions", chat());
  check_bad_response(rig, r, {"Content-Type 'text/plain'", "(100000 bytes: "});
  const std::string message = json::parse(r.body)["error"]["message"];
  CHECK(message.size() < 600);
  CHECK(message.find('\n') == std::string::npos);
}

TEST_CASE("an engine error sent as a JSON body to a streamed request keeps its status and message") {
  Rig rig;
  rig.engine.push(json_script(200, R"({"error":{"message":"prompt is too long","type":"invalid_request_error","code":400}})"));
  auto r = rig.post("/v1/chat/completions", chat());
  CAPTURE(r.body);
  CHECK(r.status == 400);
  const json e = json::parse(r.body);
  CHECK(e["error"]["message"] == "prompt is too long");
  CHECK(e["error"]["source"] == "engine");
}

// The OpenAI SDKs expose error.param; the engine's (a string, cut at 256 bytes) reaches the client.
TEST_CASE("an engine error's param is passed on, streamed or not, from an error status or a 200 body") {
  const std::string long_param(300, 'p');
  struct Case {
    bool streamed;
    int status;
    std::string param_json;
    json want;
    int client_status = 400;  // a 200 body's error has a string code here: no status in it, so 502
  };
  const Case cases[] = {
      {false, 400, R"("logit_bias")", "logit_bias"},
      {true, 400, R"("logit_bias")", "logit_bias"},
      {true, 200, R"("max_tokens")", "max_tokens", 502},  // {"error": …} as a 200 body to a stream
      {false, 400, "null", nullptr},
      {false, 400, "7", nullptr},                    // not a string: null
      {false, 400, "\"" + long_param + "\"", long_param.substr(0, 256)},
  };
  for (const Case& c : cases) {
    CAPTURE(c.streamed);
    CAPTURE(c.param_json);
    Rig rig;
    rig.engine.push(json_script(c.status, R"({"error":{"message":"bad field","type":"invalid_request_error","code":"invalid_parameter","param":)" +
                                              c.param_json + "}}"));
    auto r = rig.post("/v1/chat/completions", chat("glm53-flash", c.streamed));
    CAPTURE(r.body);
    CHECK(r.status == c.client_status);
    const json e = json::parse(r.body);
    CHECK(e["error"]["message"] == "bad field");
    CHECK(e["error"]["code"] == "invalid_parameter");
    CHECK(e["error"]["param"] == c.want);
  }
}

TEST_CASE("a stream whose body ends by its framing before a finish chunk says how it ended") {
  for (bool chunked : {true, false}) {
    CAPTURE(chunked);
    Rig rig;
    auto s = sse_script({role_ev(), content_ev("hi")});
    s.chunked = chunked;
    rig.engine.push(s);
    auto r = stream(rig, chat());
    CAPTURE(r.data);
    CHECK(r.status == 200);
    CHECK_FALSE(r.done());
    REQUIRE_FALSE(r.data.empty());
    const json e = r.event(r.data.size() - 1);
    CHECK(e["error"]["code"] == "upstream_closed");
    const std::string m = e["error"]["message"];
    CHECK(m.find("its response body ended at its declared length or last chunk") != std::string::npos);
    CHECK(m.find("()") == std::string::npos);
  }
}
