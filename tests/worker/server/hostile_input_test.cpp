// Hostile requests to the worker's HTTP surface over real HTTP on port 0 (fake model): each case
// names the input that once broke a route. A bad field is the client's 400 naming the field, the
// value read and what was expected, never a 500, and the worker keeps serving.
#include <doctest/doctest.h>

#include "tests/worker/server/server_fixture.hpp"

using namespace servedeck;
using namespace servedeck::worker;
using namespace servedeck::worker::testing;
using nlohmann::json;

namespace {

std::string error_message(const http::ClientResponse& r) { return json::parse(r.body)["error"]["message"].get<std::string>(); }

}  // namespace

TEST_CASE("/tokenize: a non-boolean return_token_strs is a 400 naming the field, not a 500") {
  Fixture f;
  auto r = f.post("/tokenize", R"({"prompt":"hi","return_token_strs":"yes"})");
  CHECK(r.status == 400);
  CHECK(error_message(r) == "field 'return_token_strs': expected true or false, got \"yes\"");
  auto ok = f.post("/tokenize", R"({"prompt":"hi","return_token_strs":true})");
  CHECK(ok.status == 200);
  CHECK(json::parse(ok.body)["token_strs"].size() == 2);
}

TEST_CASE("a body that is not JSON is refused naming the byte and the reason, on every route") {
  Fixture f;
  // note: 1e400 overflows a double; the old message said only "not valid JSON".
  const std::string overflow = R"({"messages":[{"role":"user","content":"hi"}],"temperature":1e400})";
  auto r = f.post("/v1/chat/completions", overflow);
  CHECK(r.status == 400);
  const std::string msg = error_message(r);
  CHECK(msg.find("read 65 bytes, not valid JSON: malformed JSON at byte 63") != std::string::npos);
  CHECK(msg.find("1e400") != std::string::npos);
  for (const char* route : {"/v1/completions", "/tokenize", "/detokenize"}) {
    auto t = f.post(route, R"({"prompt": "a", ])");
    CHECK(t.status == 400);
    CHECK(json::parse(t.body)["error"]["code"] == "invalid_json");
    CHECK(error_message(t).find("malformed JSON at byte 16: syntax error") != std::string::npos);
  }
}

TEST_CASE("completions: several prompts in one request are refused as such, not as a bad token id") {
  Fixture f;
  for (const char* prompt : {R"(["a", "b"])", R"([[1, 2], [3]])"}) {
    auto r = f.post("/v1/completions", std::string(R"({"max_tokens": 1, "prompt": )") + prompt + "}");
    CHECK(r.status == 400);
    CHECK(error_message(r) ==
          "field 'prompt': expected one prompt per request (a string, an array of token ids, or a one-element array of "
          "either), got an array of 2 prompts");
  }
  CHECK(f.post("/v1/completions", R"({"max_tokens": 1, "prompt": [[72, 105]]})").status == 200);
}

TEST_CASE("chat without max_tokens whose prompt fills the context names the prompt, not a max_tokens of 0") {
  Fixture f(64 * 256);  // 64 tokens of KV cache at 256 bytes per token
  const auto body = chat_body(std::string(80, 'x'), false);
  const auto prompt = json::parse(f.post("/tokenize", body.dump()).body)["count"].get<int>();
  REQUIRE(prompt >= 64);
  auto r = f.post("/v1/chat/completions", body.dump());
  CHECK(r.status == 400);
  CHECK(json::parse(r.body)["error"]["code"] == "context_length_exceeded");
  CHECK(error_message(r) == "This model's maximum context length is 4096 tokens (KV cache capacity 64 tokens). However, your "
                            "request has " + std::to_string(prompt) +
                            " input tokens, which leaves no room for output. Please reduce the length of the messages.");
}

TEST_CASE("logit_bias: an id outside the vocabulary is a 400 naming it; a valid bias steers the answer") {
  Fixture f;
  for (const char* route : {"/v1/chat/completions", "/v1/completions"}) {
    CAPTURE(route);
    const json bad_bias = {{"263", 1}};  // the fake vocabulary's 263 logits are ids 0..262
    const json body = std::string(route) == "/v1/completions"
                          ? json{{"prompt", "hi"}, {"max_tokens", 2}, {"logit_bias", bad_bias}}
                          : chat_body("hi", false, {{"max_tokens", 2}, {"logit_bias", bad_bias}});
    auto r = f.post(route, body.dump());
    CHECK(r.status == 400);
    CHECK(json::parse(r.body)["error"]["param"] == "logit_bias");
    CHECK(error_message(r) == "field 'logit_bias': token id 263 is outside the vocabulary (263 logits: ids 0..262)");
  }
  // 'Q' (81) lifted far above every logit of the greedy row: the answer is that byte, repeated.
  auto ok = f.post("/v1/completions",
                   json{{"prompt", "hi"}, {"max_tokens", 3}, {"temperature", 0}, {"logit_bias", {{"81", 100}}}}.dump());
  REQUIRE(ok.status == 200);
  CHECK(json::parse(ok.body)["choices"][0]["text"] == "QQQ");
}
