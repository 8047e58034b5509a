// The worker's HTTP surface end to end over real HTTP on port 0, with the fake model
// (fake_model.hpp): /health loading → ready, chat non-stream and stream (one SSE event per
// token, finish chunk, usage chunk, [DONE]), reasoning and tool calls (hermes and glm),
// completions with token ids and legacy logprobs, /tokenize and /detokenize, errors (bad JSON,
// bad field, KV cap with both numbers, template refusal), /v1/models, /metrics, and a client
// disconnect cancelling generation.
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <thread>

#include "common/http/client.hpp"
#include "common/sse.hpp"
#include "tests/worker/server/server_fixture.hpp"

using namespace servedeck;
using namespace servedeck::worker;
using namespace servedeck::worker::testing;
using nlohmann::json;

TEST_CASE("/health is 503 with progress while loading, then 200; generation waits for the model") {
  std::promise<void> gate;
  Fixture f(1 << 20, ToolParserKind::hermes, 0, gate.get_future().share());
  REQUIRE(poll([&] { return f.server->load_progress() >= 0.5; }));
  auto h = f.get("/health");
  CHECK(h.status == 503);
  const auto hj = json::parse(h.body);
  CHECK(hj["status"] == "loading");
  CHECK(hj["progress"].get<double>() == doctest::Approx(0.5));
  auto c = f.post("/v1/chat/completions", chat_body("hi", false).dump());
  CHECK(c.status == 503);
  CHECK(json::parse(c.body)["error"]["code"] == "model_loading");
  gate.set_value();
  CHECK(poll([&] { return f.get("/health").status == 200; }));
  CHECK(json::parse(f.get("/health").body)["status"] == "ok");
}

TEST_CASE("non-streamed chat completion") {
  Fixture f;
  auto r = f.post("/v1/chat/completions", chat_body("hi", false).dump());
  REQUIRE(r.status == 200);
  const auto j = json::parse(r.body);
  CHECK(j["object"] == "chat.completion");
  CHECK(j["model"] == "tiny");
  CHECK(j["id"].get<std::string>().rfind("chatcmpl-", 0) == 0);
  const auto& choice = j["choices"][0];
  CHECK(choice["message"]["role"] == "assistant");
  CHECK(choice["message"]["content"] == "Hello there!");
  CHECK(!choice["message"].contains("tool_calls"));
  CHECK(choice["finish_reason"] == "stop");
  // usage agrees with /tokenize of the same messages.
  const auto t = json::parse(f.post("/tokenize", chat_body("hi", false).dump()).body);
  CHECK(j["usage"]["prompt_tokens"] == t["count"]);
  CHECK(j["usage"]["completion_tokens"] == 13);  // 12 bytes + EOS
  CHECK(j["usage"]["total_tokens"] == t["count"].get<int>() + 13);
}

TEST_CASE("streamed chat: a role chunk, one event per token, finish chunk, usage, [DONE]") {
  Fixture f;
  int status = 0;
  const auto events = f.stream("/v1/chat/completions",
                               chat_body("hi", true, {{"stream_options", {{"include_usage", true}}}}).dump(), &status);
  CHECK(status == 200);
  REQUIRE(events.size() >= 4);
  CHECK(events.back() == "[DONE]");
  const auto first = json::parse(events[0]);
  CHECK(first["object"] == "chat.completion.chunk");
  CHECK(first["choices"][0]["delta"]["role"] == "assistant");
  std::string content;
  int content_events = 0;
  std::string finish;
  json usage;
  for (std::size_t i = 1; i + 1 < events.size(); ++i) {
    const auto j = json::parse(events[i]);
    if (j.contains("usage")) {
      usage = j["usage"];
      CHECK(j["choices"].empty());
      continue;
    }
    const auto& c = j["choices"][0];
    if (c["delta"].contains("content")) {
      content += c["delta"]["content"].get<std::string>();
      ++content_events;
      CHECK(c["finish_reason"].is_null());
    }
    if (!c["finish_reason"].is_null()) finish = c["finish_reason"];
  }
  CHECK(content == "Hello there!");
  CHECK(content_events == 12);  // each byte token is its own event
  CHECK(finish == "stop");
  CHECK(usage["completion_tokens"] == 13);
}

TEST_CASE("reasoning and hermes tool calls, streamed and not") {
  Fixture f;
  const json extra = {{"tools", k_weather_tools}};
  auto r = f.post("/v1/chat/completions", chat_body("weather in Paris?", false, extra).dump());
  REQUIRE(r.status == 200);
  const auto j = json::parse(r.body);
  const auto& msg = j["choices"][0]["message"];
  CHECK(msg["reasoning_content"] == "need a tool");
  CHECK(msg["content"] == "Checking.");
  REQUIRE(msg["tool_calls"].size() == 1);
  CHECK(msg["tool_calls"][0]["type"] == "function");
  CHECK(msg["tool_calls"][0]["id"].get<std::string>().rfind("call_", 0) == 0);
  CHECK(msg["tool_calls"][0]["function"]["name"] == "get_weather");
  CHECK(json::parse(msg["tool_calls"][0]["function"]["arguments"].get<std::string>()) == json{{"city", "Paris"}});
  CHECK(j["choices"][0]["finish_reason"] == "tool_calls");

  int status = 0;
  const auto events = f.stream("/v1/chat/completions", chat_body("weather in Paris?", true, extra).dump(), &status);
  REQUIRE(status == 200);
  std::string reasoning, content, args, name, id, finish;
  for (const auto& e : events) {
    if (e == "[DONE]") continue;
    const auto c = json::parse(e)["choices"][0];
    const auto& d = c["delta"];
    if (d.contains("reasoning_content")) reasoning += d["reasoning_content"].get<std::string>();
    if (d.contains("content")) content += d["content"].get<std::string>();
    if (d.contains("tool_calls")) {
      const auto& tc = d["tool_calls"][0];
      CHECK(tc["index"] == 0);
      if (tc.contains("id")) {
        CHECK(id.empty());  // the id comes once, on the first delta of the call
        id = tc["id"];
        name = tc["function"]["name"];
      }
      args += tc["function"]["arguments"].get<std::string>();
    }
    if (!c["finish_reason"].is_null()) finish = c["finish_reason"];
  }
  CHECK(reasoning == "need a tool");
  CHECK(content == "Checking.");
  CHECK(name == "get_weather");
  CHECK(id.rfind("call_", 0) == 0);
  CHECK(json::parse(args) == json{{"city", "Paris"}});
  CHECK(finish == "tool_calls");
}

TEST_CASE("glm tool parser: typed arguments from the schema") {
  Fixture f(1 << 20, ToolParserKind::glm);
  auto r = f.post("/v1/chat/completions", chat_body("glm call", false, {{"tools", k_weather_tools}}).dump());
  REQUIRE(r.status == 200);
  const auto msg = json::parse(r.body)["choices"][0]["message"];
  REQUIRE(msg["tool_calls"].size() == 1);
  CHECK(json::parse(msg["tool_calls"][0]["function"]["arguments"].get<std::string>()) == json{{"city", "Oslo"}, {"days", 3}});
  CHECK(msg["content"].is_null());
}

TEST_CASE("qwen3_coder tool parser: the XML call arrives as tool_calls typed by the schema, streamed and not") {
  Fixture f(1 << 20, ToolParserKind::qwen3_coder);
  const json extra = {{"tools", k_weather_tools}};
  auto r = f.post("/v1/chat/completions", chat_body("coder call", false, extra).dump());
  REQUIRE(r.status == 200);
  const auto j = json::parse(r.body);
  const auto msg = j["choices"][0]["message"];
  CHECK(msg["content"] == "Let me check.\n");
  REQUIRE(msg["tool_calls"].size() == 1);
  CHECK(msg["tool_calls"][0]["function"]["name"] == "get_weather");
  CHECK(json::parse(msg["tool_calls"][0]["function"]["arguments"].get<std::string>()) == json{{"city", "Oslo"}, {"days", 3}});
  CHECK(j["choices"][0]["finish_reason"] == "tool_calls");

  int status = 0;
  const auto events = f.stream("/v1/chat/completions", chat_body("coder call", true, extra).dump(), &status);
  REQUIRE(status == 200);
  std::string content, args, name, finish;
  for (const auto& e : events) {
    if (e == "[DONE]") continue;
    const auto c = json::parse(e)["choices"][0];
    const auto& d = c["delta"];
    if (d.contains("content")) content += d["content"].get<std::string>();
    if (d.contains("tool_calls")) {
      const auto& tc = d["tool_calls"][0];
      if (tc.contains("id")) name = tc["function"]["name"];
      if (tc["function"].contains("arguments")) args += tc["function"]["arguments"].get<std::string>();
    }
    if (!c["finish_reason"].is_null()) finish = c["finish_reason"];
  }
  CHECK(content == "Let me check.\n");  // no markup in the streamed content
  CHECK(name == "get_weather");
  CHECK(args == msg["tool_calls"][0]["function"]["arguments"].get<std::string>());
  CHECK(finish == "tool_calls");
}

TEST_CASE("bad requests get 400 in the OpenAI envelope naming what was read") {
  Fixture f;
  auto bad_json = f.post("/v1/chat/completions", "{\"messages\": [");
  CHECK(bad_json.status == 400);
  const auto e = json::parse(bad_json.body)["error"];
  CHECK(e["type"] == "invalid_request_error");
  CHECK(e["message"].get<std::string>().find("not valid JSON") != std::string::npos);

  auto bad_field = f.post("/v1/chat/completions", chat_body("hi", false, {{"temperature", "hot"}}).dump());
  CHECK(bad_field.status == 400);
  CHECK(json::parse(bad_field.body)["error"]["message"].get<std::string>().find("'temperature'") != std::string::npos);
  CHECK(json::parse(bad_field.body)["error"]["message"].get<std::string>().find("\"hot\"") != std::string::npos);

  auto no_messages = f.post("/v1/chat/completions", R"({"model":"tiny"})");
  CHECK(no_messages.status == 400);
  CHECK(json::parse(no_messages.body)["error"]["message"].get<std::string>().find("messages") != std::string::npos);

  auto image = f.post("/v1/chat/completions",
                      json{{"messages", {{{"role", "user"}, {"content", {{{"type", "image_url"}, {"image_url", "x"}}}}}}}}.dump());
  CHECK(image.status == 400);
  CHECK(json::parse(image.body)["error"]["message"].get<std::string>().find("image_url") != std::string::npos);

  auto refused = f.post("/v1/chat/completions", chat_body("raise", false).dump());
  CHECK(refused.status == 400);
  CHECK(json::parse(refused.body)["error"]["message"].get<std::string>().find("alternate") != std::string::npos);

  int status = 0;
  const auto events = f.stream("/v1/chat/completions", "not json", &status);
  CHECK(status == 400);  // never a 200 stream for a bad request

  CHECK(f.get("/nope").status == 404);
}

TEST_CASE("a request over the KV cache capacity is refused with both numbers") {
  Fixture f(64 * 256);  // 64 tokens at 256 bytes per token
  auto r = f.post("/v1/chat/completions", chat_body("hi", false, {{"max_tokens", 100}}).dump());
  CHECK(r.status == 400);
  const std::string msg = json::parse(r.body)["error"]["message"];
  const auto prompt = json::parse(f.post("/tokenize", chat_body("hi", false).dump()).body)["count"].get<int>();
  CHECK(msg == "prompt " + std::to_string(prompt) + " tokens + max_tokens 100 = " + std::to_string(prompt + 100) +
                   " tokens exceeds the KV cache capacity of 64 tokens (--kv-cache-bytes 16384 / 256 bytes per token, in blocks of 16 tokens)");
  // Without max_tokens the room left in the cache is used.
  auto ok = f.post("/v1/chat/completions", chat_body("hi", false).dump());
  CHECK(ok.status == 200);
}

TEST_CASE("/tokenize and /detokenize agree with the tokenizer; chat_template_kwargs reach the template") {
  Fixture f;
  FakeTextModel text;
  auto t = json::parse(f.post("/tokenize", R"({"model":"tiny","prompt":"He said llo STOP!"})").body);
  CHECK(t["tokens"].get<std::vector<int32_t>>() == text.encode("He said llo STOP!"));
  CHECK(t["count"] == t["tokens"].size());
  CHECK(t["max_model_len"] == 4096);
  auto d = json::parse(f.post("/detokenize", json{{"tokens", t["tokens"]}}.dump()).body);
  CHECK(d["prompt"] == "He said llo STOP!");
  CHECK(f.post("/detokenize", R"({"tokens":[999999]})").status == 400);

  auto plain = json::parse(f.post("/tokenize", chat_body("x", false).dump()).body);
  auto no_think = json::parse(
      f.post("/tokenize", chat_body("x", false, {{"chat_template_kwargs", {{"enable_thinking", false}}}}).dump()).body);
  CHECK(no_think["count"].get<int>() == plain["count"].get<int>() + 6);  // "<think>\n\n</think>\n\n"
  // The non-thinking answer still comes back as content.
  auto r = json::parse(f.post("/v1/chat/completions",
                              chat_body("x", false, {{"chat_template_kwargs", {{"enable_thinking", false}}}}).dump()).body);
  CHECK(r["choices"][0]["message"]["content"] == "Hello there!");
}

TEST_CASE("completions: token-id prompt, stop string, legacy logprobs, prompt_logprobs, stream") {
  Fixture f;
  FakeTextModel text;
  auto prompt = text.encode("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
  auto r = f.post("/v1/completions", json{{"prompt", prompt}, {"max_tokens", 50}, {"temperature", 0}, {"stop", "there"},
                                          {"logprobs", 2}, {"prompt_logprobs", 1}}
                                         .dump());
  REQUIRE(r.status == 200);
  const auto j = json::parse(r.body);
  CHECK(j["object"] == "text_completion");
  const auto& c = j["choices"][0];
  CHECK(c["text"] == "Hello ");
  CHECK(c["finish_reason"] == "stop");
  CHECK(c["stop_reason"] == "there");
  const auto& lp = c["logprobs"];
  REQUIRE(lp["tokens"].size() == lp["token_logprobs"].size());
  CHECK(lp["tokens"][0] == "H");
  CHECK(lp["top_logprobs"][0].size() == 2);
  CHECK(lp["text_offset"][1] == 1);
  REQUIRE(c["prompt_logprobs"].size() == prompt.size());
  CHECK(c["prompt_logprobs"][0].is_null());
  CHECK(c["prompt_logprobs"][1].contains(std::to_string(prompt[1])));

  int status = 0;
  const auto events = f.stream("/v1/completions", json{{"prompt", "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"},
                                                       {"max_tokens", 5}, {"temperature", 0}, {"stream", true}}
                                                      .dump(),
                               &status);
  CHECK(status == 200);
  std::string out, finish;
  for (const auto& e : events) {
    if (e == "[DONE]") continue;
    const auto cj = json::parse(e)["choices"][0];
    out += cj["text"].get<std::string>();
    if (!cj["finish_reason"].is_null()) finish = cj["finish_reason"];
  }
  CHECK(out == "Hello");
  CHECK(finish == "length");
  CHECK(events.back() == "[DONE]");
}

TEST_CASE("return_tokens_as_token_ids names every logprob token by its id, chat and completions") {
  Fixture f;
  FakeTextModel text;
  auto prompt = text.encode("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
  auto r = f.post("/v1/completions", json{{"prompt", prompt}, {"max_tokens", 3}, {"temperature", 0}, {"logprobs", 2},
                                          {"prompt_logprobs", 1}, {"return_tokens_as_token_ids", true}}
                                         .dump());
  REQUIRE(r.status == 200);
  const json j = json::parse(r.body);
  const auto& c = j["choices"][0];
  const auto& lp = c["logprobs"];
  REQUIRE(lp["tokens"].size() == 3);
  CHECK(lp["tokens"][0] == "token_id:" + std::to_string(text.encode("H").at(0)));
  for (const auto& top : lp["top_logprobs"]) {
    REQUIRE(top.size() == 2);
    for (const auto& [name, l] : top.items()) CHECK(name.rfind("token_id:", 0) == 0);
  }
  const auto& p1 = c["prompt_logprobs"][1][std::to_string(prompt[1])];
  CHECK(p1["decoded_token"] == "token_id:" + std::to_string(prompt[1]));

  auto body = chat_body("hi", false);
  body["logprobs"] = true;
  body["top_logprobs"] = 1;
  body["return_tokens_as_token_ids"] = true;
  const auto chat = json::parse(f.post("/v1/chat/completions", body.dump()).body);
  const auto& first = chat["choices"][0]["logprobs"]["content"][0];
  CHECK(first["token"] == "token_id:" + std::to_string(text.encode("H").at(0)));
  CHECK(first["bytes"] == json::array({'H'}));  // the token's own bytes, not its name's
  CHECK(first["top_logprobs"][0]["token"].get<std::string>().rfind("token_id:", 0) == 0);

  body["return_tokens_as_token_ids"] = "yes";
  auto bad = f.post("/v1/chat/completions", body.dump());
  CHECK(bad.status == 400);
  CHECK(json::parse(bad.body)["error"]["message"].get<std::string>().find("field 'return_tokens_as_token_ids'") == 0);
}

TEST_CASE("/v1/models and /metrics") {
  Fixture f;
  const auto m = json::parse(f.get("/v1/models").body);
  CHECK(m["object"] == "list");
  CHECK(m["data"][0]["id"] == "tiny");
  CHECK(m["data"][0]["max_model_len"] == 4096);
  REQUIRE(f.post("/v1/chat/completions", chat_body("hi", false).dump()).status == 200);
  const auto metrics = f.get("/metrics");
  CHECK(metrics.status == 200);
  CHECK(metrics.body.find("servedeck_worker_requests_total{route=\"chat\",status=\"200\"} 1") != std::string::npos);
  CHECK(metrics.body.find("servedeck_worker_generation_tokens_total 13") != std::string::npos);
  CHECK(metrics.body.find("servedeck_worker_time_to_first_token_seconds_count 1") != std::string::npos);
  for (const char* path : {"/v1/models", "/health", "/metrics"}) {  // read-only routes: GET (and HEAD) only
    auto r = f.post(path, "{}");
    CHECK(r.status == 405);
    CHECK(r.headers["allow"] == "GET, HEAD");
    CHECK(json::parse(r.body)["error"]["message"] == std::string("POST ") + path + ": expected GET");
  }
  http::ClientRequest head;
  head.port = f.server->port();
  head.method = "HEAD";
  head.target = "/health";
  auto h = http::fetch(head);
  CHECK(h.status == 200);
  CHECK(h.body.empty());
}

TEST_CASE("a client that goes away cancels its generation and frees the cache") {
  Fixture f(1 << 22, ToolParserKind::hermes, /*delay_ms=*/2);
  int status = 0;
  const auto events = f.stream("/v1/chat/completions", chat_body("long story", true, {{"max_tokens", 3000}}).dump(), &status, 4);
  CHECK(status == 200);
  CHECK(events.size() == 4);
  REQUIRE(poll([&] {
    const auto s = f.handles.engine->stats();
    return !s.running && s.requests_finished == 1;
  }));
  CHECK(f.handles.engine->stats().kv_blocks.held == 0);
  const auto calls = f.handles.backend->forward_calls.load();
  CHECK(calls < 3000);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  CHECK(f.handles.backend->forward_calls.load() == calls);  // the scheduler stopped
  CHECK(f.get("/metrics").body.find("route=\"chat\",status=\"499\"") != std::string::npos);
}

TEST_CASE("a backend failure mid-stream ends with an error event and no [DONE]; before any token it is a 500") {
  Fixture f;
  f.handles.backend->fail_after_calls = static_cast<int>(f.handles.backend->forward_calls.load()) + 4;
  int status = 0;
  const auto events = f.stream("/v1/chat/completions", chat_body("hi", true).dump(), &status);
  CHECK(status == 200);
  REQUIRE(events.size() >= 2);
  CHECK(std::find(events.begin(), events.end(), "[DONE]") == events.end());
  const auto last = json::parse(events.back());
  REQUIRE(last.contains("error"));
  CHECK(last["error"]["message"].get<std::string>().find("fake backend failure") != std::string::npos);
  CHECK(last["error"]["source"] == "engine");
  std::string content;
  for (std::size_t i = 0; i + 1 < events.size(); ++i) {
    const auto c = json::parse(events[i])["choices"][0]["delta"];
    content += c.value("content", std::string());
  }
  CHECK(content == "Hell");  // prefill + 3 decode steps sample 4 tokens; the 5th forward fails

  f.handles.backend->fail_after_calls = static_cast<int>(f.handles.backend->forward_calls.load());  // fails at prefill
  const auto early = f.stream("/v1/chat/completions", chat_body("hi", true).dump(), &status);
  CHECK(status == 500);
  REQUIRE(early.empty());  // a plain JSON error, not an SSE stream
  auto plain = f.post("/v1/chat/completions", chat_body("hi", false).dump());
  CHECK(plain.status == 500);
  CHECK(json::parse(plain.body)["error"]["message"].get<std::string>().find("prefill failed") != std::string::npos);
}
