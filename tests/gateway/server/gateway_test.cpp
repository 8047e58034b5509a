// The gateway end to end: a client (common/http) → Gateway → an in-process fake engine
// replaying recorded streams. Asserts exactly what the client receives.
#include <doctest/doctest.h>

#include "tests/gateway/server/fake_engine.hpp"

#include <cstdlib>
#include <filesystem>
#include <tuple>

#include "common/http/client.hpp"
#include "common/sse.hpp"
#include "gateway/server/gateway.hpp"
#include "gateway/server/metrics.hpp"
#include "gateway/state/store.hpp"

using namespace servedeck;
using nlohmann::json;
using test::FakeEngine;
using test::FakeSlotControl;
using test::Script;

namespace {

template <class F>
bool wait_for(F pred, int timeout_ms = 5000) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (std::chrono::steady_clock::now() < deadline) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return pred();
}

registry::Registry make_registry() {
  registry::Registry reg;
  registry::ModelEntry glm;
  glm.name = "glm53";
  glm.served_name = "glm53-flash";
  glm.aliases = {"glm"};
  glm.presets = {{"glm53-flash-low", json{{"reasoning_effort", "low"}}, std::nullopt},
                 {"glm53-flash-high", json{{"reasoning_effort", "high"}}, std::nullopt}};
  glm.ctx = 131072;
  // note: the registry's own deadlines (minutes) here; the deadline test tightens them. Tight
  // deadlines on every test tripped spuriously on a loaded 2-core CI box under ASan (a 300 ms
  // max_gap_ms cut the 10 MiB backpressure stream with upstream_gap_timeout).
  reg.models.push_back(glm);
  registry::ModelEntry qwen;
  qwen.name = "qwen";
  qwen.served_name = "qwen3.8-flash-next";
  qwen.ctx = 16384;
  reg.models.push_back(qwen);
  registry::ModelEntry lazy;
  lazy.name = "lazy";
  lazy.served_name = "lazy-model";
  lazy.ctx = 4096;
  lazy.switch_on_request = true;
  lazy.queue_max = 1;
  lazy.queue_timeout_s = 2;
  reg.models.push_back(lazy);
  reg.server.max_body_bytes = 4096;
  return reg;
}

struct TempDir {
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "servedeck-gw-XXXXXX").string();
    path = mkdtemp(tmpl.data());
  }
  ~TempDir() { std::filesystem::remove_all(path); }
  std::string path;
};

/// Engine + slot + store + gateway, wired up.
struct Rig {
  explicit Rig(std::string running = "glm53", int heartbeat_ms = 5000,
               const std::function<void(registry::Registry&)>& tweak = nullptr)
      : reg([&] {
          auto r = make_registry();
          if (tweak) tweak(r);
          return r;
        }()),
        store(dir.path), slots(std::move(running), engine.port()),
        gw(reg, store, slots, [&] {
          gateway::GatewayOptions o;
          o.heartbeat_ms = heartbeat_ms;
          o.retry_after_s = 7;
          return o;
        }()) {
    gw.start();
  }
  http::ClientResponse post(const std::string& path, const std::string& body, http::Headers headers = {}) {
    http::ClientRequest r;
    r.port = gw.port();
    r.method = "POST";
    r.target = path;
    r.body = body;
    r.headers = std::move(headers);
    return http::fetch(r);
  }
  http::ClientResponse get(const std::string& path) {
    http::ClientRequest r;
    r.port = gw.port();
    r.target = path;
    return http::fetch(r);
  }
  TempDir dir;
  FakeEngine engine;
  registry::Registry reg;
  state::Store store;
  FakeSlotControl slots;
  gateway::Gateway gw;
};

std::string chat(const std::string& model = "glm53-flash", bool stream = true, const std::string& extra = "") {
  return R"({"model":")" + model + R"(","stream":)" + (stream ? "true" : "false") +
         R"(,"messages":[{"role":"user","content":"hi"}])" + extra + "}";
}

std::string role_ev() { return R"({"id":"c1","object":"chat.completion.chunk","created":1,"model":"glm53-flash","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]})"; }
std::string content_ev(const std::string& t, const std::string& finish = "null") {
  return R"({"id":"c1","object":"chat.completion.chunk","created":1,"model":"glm53-flash","choices":[{"index":0,"delta":{"content":")" + t +
         R"("},"finish_reason":)" + finish + "}]}";
}
std::string finish_ev() { return R"({"id":"c1","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]})"; }
std::string usage_ev() { return R"({"id":"c1","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}})"; }

/// Events the client received (data payloads) and the HTTP status.
struct Received {
  int status = 0;
  std::vector<std::string> data;
  std::vector<std::string> comments;
  bool done() const { return !data.empty() && data.back() == "[DONE]"; }
  json event(std::size_t i) const { return json::parse(data.at(i)); }
};

Received stream(Rig& rig, const std::string& body, std::function<bool(const Received&)> keep_going = nullptr) {
  http::ClientRequest r;
  r.port = rig.gw.port();
  r.method = "POST";
  r.target = "/v1/chat/completions";
  r.body = body;
  Received out;
  sse::Parser p;
  http::fetch_stream(
      r, [&](int s, const std::map<std::string, std::string>&) { out.status = s; },
      [&](std::string_view c) {
        for (auto& e : p.feed(c)) (e.comment ? out.comments : out.data).push_back(e.data);
        return keep_going ? keep_going(out) : true;
      });
  return out;
}

}  // namespace

TEST_CASE("clean recorded stream passes through, cut at awkward boundaries") {
  Rig rig;
  rig.engine.push(test::sse_script({role_ev(), content_ev("Hel"), content_ev("lo"), finish_ev(), usage_ev(), "[DONE]"}, 5));
  auto r = stream(rig, chat("glm53-flash", true, R"(,"stream_options":{"include_usage":true})"));
  CHECK(r.status == 200);
  REQUIRE(r.data.size() == 6);
  CHECK(r.event(1)["choices"][0]["delta"]["content"] == "Hel");
  CHECK(r.event(2)["choices"][0]["delta"]["content"] == "lo");
  CHECK(r.event(3)["choices"][0]["finish_reason"] == "stop");
  CHECK(r.event(4)["usage"]["completion_tokens"] == 2);
  CHECK(r.done());
  // The engine got its served name and was asked for usage.
  auto sent = rig.engine.last_body();
  CHECK(sent["model"] == "glm53-flash");
  CHECK(sent["stream_options"]["include_usage"] == true);
  // One request-log row, no body.
  REQUIRE(wait_for([&] { return rig.store.count_requests("/v1/chat/completions") == 1; }));
  auto rows = rig.store.recent_requests(1);
  CHECK(rows[0].model == "glm53");
  CHECK(rows[0].alias == "glm53-flash");
  CHECK(rows[0].status == 200);
  CHECK(rows[0].stream);
  CHECK(rows[0].completion_tokens == 2);
  CHECK(rows[0].error_code.empty());
}

TEST_CASE("G21a/G21b endings through the gateway") {
  Rig rig;
  SUBCASE("finish on the content chunk + usage-only tail, usage not asked") {
    rig.engine.push(test::sse_script({role_ev(), content_ev("Hi", "\"stop\""), usage_ev(), "[DONE]"}, 3));
    auto r = stream(rig, chat());
    REQUIRE(r.data.size() == 4);
    CHECK(r.event(1)["choices"][0]["finish_reason"].is_null());
    CHECK(r.event(2)["choices"][0]["finish_reason"] == "stop");
    CHECK(r.done());
  }
  SUBCASE("last chunk finish null, then [DONE]") {
    rig.engine.push(test::sse_script({role_ev(), content_ev("Hi"), "[DONE]"}, 11));
    auto r = stream(rig, chat());
    REQUIRE(r.data.size() == 4);
    CHECK(r.event(2)["choices"][0]["finish_reason"] == "stop");
    CHECK(r.done());
  }
}

TEST_CASE("upstream cut mid-stream: an error event, no [DONE]") {
  Rig rig;
  auto s = test::sse_script({role_ev(), content_ev("partial")}, 9);
  s.ending = Script::Ending::cut;
  rig.engine.push(s);
  auto r = stream(rig, chat());
  CHECK(r.status == 200);
  REQUIRE(r.data.size() == 3);
  CHECK(r.event(1)["choices"][0]["delta"]["content"] == "partial");
  CHECK(r.event(2)["error"]["code"] == "upstream_closed");
  CHECK_FALSE(r.done());
  REQUIRE(wait_for([&] { return rig.store.count_requests("/v1/chat/completions") == 1; }));
  CHECK(rig.store.recent_requests(1)[0].error_code == "upstream_closed");
}

TEST_CASE("G23: an error event after content ends the stream with that error, no [DONE]") {
  Rig rig;
  auto s = test::sse_script({role_ev(), content_ev("The answer"),
                             R"({"error":{"code":500,"message":"Context size has been exceeded.","type":"server_error"}})"},
                            13);
  s.ending = Script::Ending::cut;
  rig.engine.push(s);
  auto r = stream(rig, chat());
  CHECK(r.status == 200);
  REQUIRE(r.data.size() == 3);
  auto e = r.event(2)["error"];
  CHECK(e["message"] == "Context size has been exceeded.");
  CHECK(e["source"] == "engine");
  CHECK_FALSE(r.done());
}

TEST_CASE("an empty stream gets a real error status, not 200") {
  Rig rig;
  rig.engine.push(test::sse_script({role_ev(), finish_ev(), "[DONE]"}));
  auto r = rig.post("/v1/chat/completions", chat());
  CHECK(r.status == 502);
  CHECK(json::parse(r.body)["error"]["code"] == "empty_stream");
}

TEST_CASE("the first upstream event an error: a real status") {
  Rig rig;
  rig.engine.push(test::sse_script({R"({"error":{"code":400,"message":"failed to parse input at pos 12","type":"invalid_request_error"}})"}));
  auto r = rig.post("/v1/chat/completions", chat());
  CHECK(r.status == 400);
  auto e = json::parse(r.body)["error"];
  CHECK(e["message"] == "failed to parse input at pos 12");
  CHECK(e["source"] == "engine");
  CHECK(rig.engine.requests() == 1);
}

TEST_CASE("G09: an error after only the role chunk is retried once, transparently") {
  Rig rig;
  rig.engine.push(test::sse_script({role_ev(), R"({"error":{"code":500,"message":"failed to parse input at pos 3"}})"}));
  rig.engine.push(test::sse_script({role_ev(), content_ev("ok"), finish_ev(), "[DONE]"}));
  auto r = stream(rig, chat());
  CHECK(r.status == 200);
  REQUIRE(r.data.size() == 4);
  CHECK(r.event(0)["choices"][0]["delta"]["role"] == "assistant");
  CHECK(r.event(1)["choices"][0]["delta"]["content"] == "ok");
  CHECK(r.done());
  CHECK(rig.engine.requests() == 2);
}

TEST_CASE("G09: the retry happens once; a second failure gets a real status") {
  Rig rig;
  rig.engine.push(test::sse_script({role_ev(), R"({"error":{"code":500,"message":"boom"}})"}));
  auto r = rig.post("/v1/chat/completions", chat());
  CHECK(r.status == 500);
  CHECK(json::parse(r.body)["error"]["message"] == "boom");
  CHECK(rig.engine.requests() == 2);  // first try + one retry
}

TEST_CASE("engine HTTP errors pass through with source engine, streamed or not") {
  Rig rig;
  rig.engine.push(test::json_script(500, R"({"error":{"message":"CUDA out of memory","type":"server_error","code":"oom"}})"));
  auto r = rig.post("/v1/chat/completions", chat("glm", false));
  CHECK(r.status == 500);
  auto e = json::parse(r.body)["error"];
  CHECK(e["message"] == "CUDA out of memory");
  CHECK(e["source"] == "engine");
}

TEST_CASE("deadlines: time to first byte and the gap between events") {
  // Only the deadline under test is tight: the other stays generous, so a loaded machine
  // (ASan, 2 cores, tests in parallel) cannot trip it first.
  SUBCASE("TTFT") {
    Rig rig("glm53", 5000, [](registry::Registry& r) { r.models[0].first_byte_timeout_ms = 400; });
    Script s = test::sse_script({role_ev(), content_ev("late"), finish_ev(), "[DONE]"});
    s.pieces.front().delay_ms = 1500;
    rig.engine.push(s);
    auto t0 = std::chrono::steady_clock::now();
    auto r = rig.post("/v1/chat/completions", chat());
    // Answered by the gateway's deadline, well before the engine's first byte.
    CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(1400));
    CHECK(r.status == 504);
    CHECK(json::parse(r.body)["error"]["code"] == "upstream_first_byte_timeout");
    CHECK(json::parse(r.body)["error"]["type"] == "timeout_error");
  }
  SUBCASE("gap: an error event after content") {
    Rig rig("glm53", 5000, [](registry::Registry& r) { r.models[0].max_gap_ms = 300; });
    std::string wire = "data: " + role_ev() + "\n\ndata: " + content_ev("a") + "\n\n";
    Script s;
    s.pieces = {{wire, 0}, {"data: " + content_ev("b") + "\n\n", 800}};
    rig.engine.push(s);
    auto r = stream(rig, chat());
    REQUIRE(r.data.size() == 3);
    CHECK(r.event(2)["error"]["code"] == "upstream_gap_timeout");
    CHECK(r.event(2)["error"]["type"] == "timeout_error");
    CHECK_FALSE(r.done());
  }
}

TEST_CASE("client disconnect cancels the upstream at once") {
  Rig rig;
  Script s;
  s.pieces = {{"data: " + role_ev() + "\n\ndata: " + content_ev("first") + "\n\n", 0}};
  s.ending = Script::Ending::hang;
  rig.engine.push(s);
  auto r = stream(rig, chat(), [](const Received& got) { return got.data.size() < 2; });  // hang up after content
  CHECK(r.data.size() == 2);
  CHECK(wait_for([&] { return rig.engine.disconnects() == 1; }, 3000));
  REQUIRE(wait_for([&] { return rig.store.count_requests("/v1/chat/completions") == 1; }));
  CHECK(rig.store.recent_requests(1)[0].status == 499);
  CHECK(wait_for([&] { return rig.slots.leases() == 0; }));
}

TEST_CASE("non-streaming: G11 null fields omitted, model echoed, usage logged") {
  Rig rig;
  rig.engine.push(test::json_script(
      200,
      R"({"id":"x","object":"chat.completion","created":1,"model":"glm53-flash","choices":[{"index":0,"message":{"role":"assistant","content":"hi","tool_calls":null,"refusal":null},"finish_reason":"stop"}],"usage":{"prompt_tokens":4,"completion_tokens":1,"total_tokens":5}})"));
  auto r = rig.post("/v1/chat/completions", chat("glm53-flash-low", false));
  CHECK(r.status == 200);
  auto b = json::parse(r.body);
  CHECK(b["model"] == "glm53-flash-low");
  CHECK(b["choices"][0]["message"] == json{{"role", "assistant"}, {"content", "hi"}});
  REQUIRE(wait_for([&] { return rig.store.count_requests("/v1/chat/completions") == 1; }));
  auto row = rig.store.recent_requests(1)[0];
  CHECK(row.prompt_tokens == 4);
  CHECK(row.alias == "glm53-flash-low");
  CHECK_FALSE(row.stream);
}

TEST_CASE("request errors the gateway answers itself") {
  Rig rig;
  SUBCASE("413 over the body limit") {
    auto r = rig.post("/v1/chat/completions", chat("glm", false, R"(,"pad":")" + std::string(5000, 'x') + "\""));
    CHECK(r.status == 413);
    CHECK(json::parse(r.body)["error"]["code"] == "body_too_large");
  }
  SUBCASE("400 naming the byte offset") {
    auto r = rig.post("/v1/chat/completions", R"({"model": "glm", "messages": [}])");
    CHECK(r.status == 400);
    auto e = json::parse(r.body)["error"];
    CHECK(e["code"] == "invalid_json");
    // `{"model": "glm", "messages": [}]}`: the stray '}' is byte 30.
    CHECK_MESSAGE(e["message"].get<std::string>().find("at byte 30:") != std::string::npos, e["message"]);
  }
  SUBCASE("404 for an unknown model, listing the configured ids") {
    auto r = rig.post("/v1/chat/completions", chat("gpt-9"));
    CHECK(r.status == 404);
    CHECK(json::parse(r.body)["error"]["message"].get<std::string>().find("glm53-flash-high") != std::string::npos);
  }
  SUBCASE("409 naming the running model and the switch command") {
    auto r = rig.post("/v1/chat/completions", chat("qwen3.8-flash-next"));
    CHECK(r.status == 409);
    auto e = json::parse(r.body)["error"];
    CHECK(e["code"] == "model_not_running");
    auto m = e["message"].get<std::string>();
    CHECK(m.find("'glm53'") != std::string::npos);
    CHECK(m.find("servedeck switch qwen") != std::string::npos);
    CHECK(rig.slots.ensure_calls() == 0);
  }
  CHECK(rig.engine.requests() == 0);
}

TEST_CASE("G18: aliases of one base model never ask for a switch") {
  Rig rig;
  rig.engine.push(test::sse_script({role_ev(), content_ev("x"), finish_ev(), "[DONE]"}));
  for (int i = 0; i < 4; ++i) {
    auto r = stream(rig, chat(i % 2 ? "glm53-flash-low" : "glm53-flash-high"));
    CHECK(r.done());
  }
  CHECK(rig.engine.requests() == 4);
  CHECK(rig.slots.ensure_calls() == 0);
  CHECK(rig.slots.starts() == 0);
}

TEST_CASE("G31: /v1/models lists every configured id with its own context") {
  Rig rig("qwen");
  auto r = rig.get("/v1/models");
  CHECK(r.status == 200);
  auto data = json::parse(r.body)["data"];
  std::map<std::string, int64_t> ctx;
  for (const auto& m : data) {
    CHECK(m["owned_by"] == "servedeck");
    ctx[m["id"]] = m["max_model_len"];
  }
  CHECK(ctx.size() == 6);
  CHECK(ctx["glm53-flash"] == 131072);
  CHECK(ctx["glm"] == 131072);
  CHECK(ctx["glm53-flash-low"] == 131072);
  CHECK(ctx["qwen3.8-flash-next"] == 16384);
  CHECK(ctx["lazy-model"] == 4096);
}

TEST_CASE("switch_on_request: queued while the model loads, heartbeats to a waiting stream") {
  Rig rig("glm53", 30);
  rig.slots.switch_delay_ms = 200;
  rig.engine.push(test::sse_script({role_ev(), content_ev("loaded"), finish_ev(), "[DONE]"}));
  auto r = stream(rig, chat("lazy-model"));
  CHECK(r.status == 200);
  CHECK(rig.slots.ensure_calls() == 1);
  CHECK_FALSE(r.comments.empty());
  CHECK(r.comments[0].find("waiting for model lazy") != std::string::npos);
  REQUIRE(r.data.size() == 4);
  CHECK(r.event(1)["choices"][0]["delta"]["content"] == "loaded");
  CHECK(r.done());
}

TEST_CASE("switch_on_request: a failed switch and a full queue answer 503 with Retry-After") {
  Rig rig;
  rig.slots.switch_ok = false;
  auto r = rig.post("/v1/chat/completions", chat("lazy-model", false));
  CHECK(r.status == 503);
  CHECK(r.headers["retry-after"] == "7");
  CHECK(json::parse(r.body)["error"]["message"].get<std::string>().find("host RAM") != std::string::npos);
  rig.slots.switch_ok = true;
  rig.slots.switch_delay_ms = 2300;  // longer than queue_timeout_s = 2
  std::thread first([&] {
    auto t = rig.post("/v1/chat/completions", chat("lazy-model", false));
    CHECK(t.status == 503);
    CHECK(json::parse(t.body)["error"]["code"] == "queue_timeout");
  });
  REQUIRE(wait_for([&] { return rig.slots.ensure_calls() == 2; }));
  auto full = rig.post("/v1/chat/completions", chat("lazy-model", false));  // queue_max = 1
  CHECK(full.status == 503);
  CHECK(json::parse(full.body)["error"]["code"] == "queue_full");
  first.join();
}

TEST_CASE("API keys: 401 envelope without a valid bearer token; /health stays open") {
  TempDir dir;
  FakeEngine engine;
  auto reg = make_registry();
  reg.server.api_keys = {"sk-local"};
  state::Store store(dir.path);
  FakeSlotControl slots("glm53", engine.port());
  gateway::Gateway gw(reg, store, slots, {});
  gw.start();
  http::ClientRequest r;
  r.port = gw.port();
  r.target = "/v1/models";
  auto a = http::fetch(r);
  CHECK(a.status == 401);
  CHECK(json::parse(a.body)["error"]["type"] == "authentication_error");
  r.headers = {{"Authorization", "Bearer sk-local"}};
  CHECK(http::fetch(r).status == 200);
  r.headers = {};
  r.target = "/health";
  CHECK(http::fetch(r).status == 200);
}

TEST_CASE("/metrics: requests by model and status, repairs, slot state; admin routes") {
  Rig rig;
  rig.engine.push(test::sse_script({role_ev(), content_ev("x"), finish_ev(), "[DONE]"}));
  stream(rig, chat());
  rig.post("/v1/chat/completions", chat("qwen3.8-flash-next"));
  rig.gw.metrics().count_repair("sanitize_tool_tags", "glm53");
  REQUIRE(wait_for([&] { return rig.gw.metrics().requests("glm53", 200) == 1; }));
  auto m = rig.get("/metrics");
  CHECK(m.status == 200);
  CHECK(m.body.find("servedeck_requests_total{model=\"glm53\",status=\"200\"} 1") != std::string::npos);
  CHECK(m.body.find("servedeck_requests_total{model=\"qwen\",status=\"409\"} 1") != std::string::npos);
  CHECK(m.body.find("servedeck_policy_repairs_total{policy=\"sanitize_tool_tags\",model=\"glm53\"} 1") != std::string::npos);
  CHECK(m.body.find("servedeck_slot_state{model=\"glm53\",state=\"ready\"} 1") != std::string::npos);
  CHECK(m.body.find("servedeck_ttft_seconds_count{model=\"glm53\"} 1") != std::string::npos);
  CHECK(m.body.find("servedeck_in_flight_requests 0") != std::string::npos);
  auto h = rig.get("/health");
  CHECK(json::parse(h.body)["slot"]["model"] == "glm53");
  CHECK(rig.get("/nope").status == 404);
}

TEST_CASE("/v1/completions streams text chunks with one finish chunk") {
  Rig rig;
  rig.engine.push(test::sse_script({R"({"id":"cmpl-1","object":"text_completion","choices":[{"index":0,"text":"ab","finish_reason":null}]})",
                                    R"({"id":"cmpl-1","object":"text_completion","choices":[{"index":0,"text":"c","finish_reason":"length"}]})",
                                    "[DONE]"}));
  http::ClientRequest r;
  r.port = rig.gw.port();
  r.method = "POST";
  r.target = "/v1/completions";
  r.body = R"({"model":"glm","prompt":"x","stream":true})";
  std::string body;
  http::fetch_stream(r, nullptr, [&](std::string_view c) { body.append(c); return true; });
  sse::Parser p;
  auto ev = p.feed(body);
  REQUIRE(ev.size() == 4);
  CHECK(json::parse(ev[0].data)["choices"][0]["text"] == "ab");
  CHECK(json::parse(ev[1].data)["choices"][0]["finish_reason"].is_null());
  CHECK(json::parse(ev[2].data)["choices"][0]["finish_reason"] == "length");
  CHECK(ev[3].data == "[DONE]");
  CHECK(rig.engine.last_body()["model"] == "glm53-flash");
}

TEST_CASE("an unreachable engine: 502 engine_unreachable") {
  int closed_port = 0;
  {
    http::Server s({}, [](http::Request, std::shared_ptr<http::Responder> res) { res->send(200, "text/plain", ""); });
    s.start();
    closed_port = s.port();
  }
  TempDir dir;
  auto reg = make_registry();
  state::Store store(dir.path);
  FakeSlotControl slots("glm53", closed_port);
  gateway::Gateway gw(reg, store, slots, {});
  gw.start();
  http::ClientRequest r;
  r.port = gw.port();
  r.method = "POST";
  r.target = "/v1/chat/completions";
  r.body = chat();
  auto a = http::fetch(r);
  CHECK(a.status == 502);
  CHECK(json::parse(a.body)["error"]["code"] == "engine_unreachable");
  CHECK(wait_for([&] { return slots.leases() == 0; }));
}

TEST_CASE("admin routes registered with add_route are served") {
  TempDir dir;
  FakeEngine engine;
  auto reg = make_registry();
  state::Store store(dir.path);
  FakeSlotControl slots("glm53", engine.port());
  gateway::Gateway gw(reg, store, slots, {});
  gw.add_route("POST", "/admin/switch", [](http::Request req, std::shared_ptr<http::Responder> res) {
    res->send(202, "application/json", R"({"accepted":)" + req.body + "}");
  });
  gw.start();
  http::ClientRequest r;
  r.port = gw.port();
  r.method = "POST";
  r.target = "/admin/switch";
  r.body = "1";
  auto a = http::fetch(r);
  CHECK(a.status == 202);
  CHECK(json::parse(a.body)["accepted"] == 1);
  r.method = "GET";
  r.body.clear();
  CHECK(http::fetch(r).status == 405);
  r.method = "DELETE";  // an admin path: 405 naming what it takes
  auto d = http::fetch(r);
  CHECK(d.status == 405);
  CHECK(d.headers["allow"] == "POST");
  // The OpenAI and health routes: 405 naming the method they take, with Allow (never a 404).
  for (auto [method, target, allow, expected] :
       {std::tuple{"POST", "/metrics", "GET, HEAD", "GET"}, std::tuple{"DELETE", "/v1/models", "GET, HEAD", "GET"},
        std::tuple{"GET", "/v1/chat/completions", "POST", "POST"}, std::tuple{"PUT", "/v1/responses", "POST", "POST"}}) {
    r.method = method;
    r.target = target;
    auto got = http::fetch(r);
    INFO(method << " " << target);
    CHECK(got.status == 405);
    CHECK(got.headers["allow"] == std::string(allow));
    CHECK(json::parse(got.body)["error"]["message"] ==
          std::string("method ") + method + " not allowed on " + target + "; expected " + expected);
  }
  // HEAD on a read-only route is GET without the body (RFC 9110: a server supports GET and HEAD).
  r.method = "HEAD";
  r.target = "/health";
  auto h = http::fetch(r);
  CHECK(h.status == 200);
  CHECK(h.body.empty());
  CHECK(std::stoul(h.headers["content-length"]) > 0);
}

TEST_CASE("backpressure: a fast engine and a slow client lose nothing") {
  Rig rig;
  // ~10 MiB at once from the engine: more than the server's 8 MiB stuck-client bound, so
  // without pausing the engine the client would be cut off.
  const std::string piece(2500, 'x');
  const int n = 4000;
  std::string wire = "data: " + role_ev() + "\n\n";
  for (int i = 0; i < n; ++i) wire += "data: " + content_ev(piece) + "\n\n";
  wire += "data: " + finish_ev() + "\n\ndata: [DONE]\n\n";
  Script s;
  s.pieces = test::split_pieces(wire, 1 << 20);
  rig.engine.push(s);
  std::size_t content = 0;
  int reads = 0;
  auto r = stream(rig, chat(), [&](const Received& got) {
    if (++reads < 300) std::this_thread::sleep_for(std::chrono::milliseconds(2));  // a slow reader at first
    (void)got;
    return true;
  });
  for (std::size_t i = 1; i + 2 < r.data.size(); ++i)
    content += r.event(i)["choices"][0]["delta"]["content"].get<std::string>().size();
  INFO("last event: " << (r.data.empty() ? std::string("(none)") : r.data.back().substr(0, 300)));
  CHECK(r.data.size() == static_cast<std::size_t>(n) + 3);
  CHECK(content == piece.size() * n);
  CHECK(r.done());
}

TEST_CASE("stopping the gateway mid-stream cancels the upstream call and releases its lease") {
  // The client's connection closes with the server; its disconnect callback (queued on the
  // upstream strand) must still run, or the call and its upstream keep each other alive (a leak
  // LSan reports) and the lease is never released.
  Rig rig;
  Script s;
  s.pieces = {{"data: " + role_ev() + "\n\ndata: " + content_ev("first") + "\n\n", 0}};
  s.ending = Script::Ending::hang;
  rig.engine.push(s);
  std::atomic<bool> got_content{false};
  std::thread client([&] {
    try {
      stream(rig, chat(), [&](const Received& got) {
        if (got.data.size() >= 2) got_content = true;
        return true;
      });
    } catch (const std::exception&) {
      // the gateway went away mid-stream
    }
  });
  REQUIRE(wait_for([&] { return got_content.load(); }));
  CHECK(rig.slots.leases() == 1);
  rig.gw.stop();
  client.join();
  CHECK(rig.slots.leases() == 0);
  CHECK(wait_for([&] { return rig.engine.disconnects() == 1; }, 3000));
}
