// The gateway's routes end to end (same rig as gateway_test.cpp): request errors it answers
// itself, aliases and /v1/models, switch_on_request queueing, API keys, /metrics, completions,
// an unreachable engine, admin routes and the methods each route takes, the access checks made
// from a request's head (API keys, Host, Origin, Content-Type).
#include "tests/gateway/server/gateway_rig.hpp"

#include <sys/socket.h>

#include <boost/asio.hpp>

using namespace servedeck;
using namespace servedeck::test::gateway_rig;

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
  SUBCASE("404 for a very long unknown model id: the id quoted cut, and cut in the request log") {
    const std::string id(3000, 'm');
    auto r = rig.post("/v1/chat/completions", chat(id));
    CHECK(r.status == 404);
    const auto m = json::parse(r.body)["error"]["message"].get<std::string>();
    CHECK_MESSAGE(m.find(std::string(128, 'm') + "\xE2\x80\xA6 (3000 bytes)") != std::string::npos, m);
    CHECK(m.find(std::string(129, 'm')) == std::string::npos);
    REQUIRE(wait_for([&] { return !rig.store.recent_requests(1).empty(); }));
    const auto row = rig.store.recent_requests(1)[0];
    CHECK(row.status == 404);
    CHECK(row.alias.size() < 200);
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
  SUBCASE("409 for a model whose slot failed: says failed, gives the reason and how to retry") {
    rig.slots.set_state(gateway::SlotState::failed, "glm53");
    rig.slots.set_last_error("preflight refused glm53:\npreflight glm53: REFUSED (3 refused, 0 warnings, 9 checks)\n...");
    auto r = rig.post("/v1/chat/completions", chat("glm53-flash"));
    CHECK(r.status == 409);
    auto e = json::parse(r.body)["error"];
    CHECK(e["code"] == "model_not_running");
    auto m = e["message"].get<std::string>();
    INFO(m);
    CHECK(m.find("'glm53' (requested as 'glm53-flash') is not running") != std::string::npos);
    CHECK(m.find("slot is failed: preflight refused glm53:") != std::string::npos);
    CHECK(m.find("REFUSED (3 refused") == std::string::npos);  // only the first line of the reason
    CHECK(m.find("the running model is") == std::string::npos);
    CHECK(m.find("servedeck status") != std::string::npos);
    CHECK(m.find("servedeck switch glm53") != std::string::npos);
    CHECK(rig.slots.ensure_calls() == 0);
  }
  SUBCASE("409 for a model whose switch preflight refused before the stop: quotes the refused checks") {
    rig.slots.set_refusal("qwen",
                          "checkpoint: /models/qwen is missing (no config.json)\nctx_validated: ctx 262144 > validated_ctx 131072");
    auto r = rig.post("/v1/chat/completions", chat("qwen3.8-flash-next"));
    CHECK(r.status == 409);
    auto e = json::parse(r.body)["error"];
    CHECK(e["code"] == "model_not_running");
    auto m = e["message"].get<std::string>();
    INFO(m);
    CHECK(m.find("'qwen' (requested as 'qwen3.8-flash-next') is not running: its last switch was refused "
                 "by preflight: checkpoint: /models/qwen is missing (no config.json); ctx_validated: ctx 262144 > "
                 "validated_ctx 131072; the running model is 'glm53' (ready)") != std::string::npos);
    CHECK(m.find('\n') == std::string::npos);
    CHECK(m.find("servedeck switch qwen") != std::string::npos);
    // Only that model's 409 says so: another model not running gets the ordinary one.
    rig.slots.set_refusal("glm53", "program: program /x is missing or not executable");
    auto other = json::parse(rig.post("/v1/chat/completions", chat("qwen3.8-flash-next")).body)["error"]["message"]
                     .get<std::string>();
    INFO(other);
    CHECK(other.find("refused") == std::string::npos);
    CHECK(other.find("program /x") == std::string::npos);
    CHECK(other.find("the running model is 'glm53' (ready)") != std::string::npos);
    CHECK(rig.slots.ensure_calls() == 0);
  }
  SUBCASE("409 for another model while the slot is failed: names the failed slot, not a running model") {
    rig.slots.set_state(gateway::SlotState::failed, "glm53");
    rig.slots.set_last_error("engine exited during start with status 1");
    auto r = rig.post("/v1/chat/completions", chat("qwen3.8-flash-next"));
    CHECK(r.status == 409);
    auto m = json::parse(r.body)["error"]["message"].get<std::string>();
    INFO(m);
    CHECK(m.find("the slot is failed (last model 'glm53')") != std::string::npos);
    CHECK(m.find("the running model is") == std::string::npos);
    CHECK(m.find("servedeck switch qwen") != std::string::npos);
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

TEST_CASE("API keys are checked from the head: a refused client's body is never waited for") {
  TempDir dir;
  FakeEngine engine;
  auto reg = make_registry();
  reg.server.api_keys = {"sk-local"};
  state::Store store(dir.path);
  FakeSlotControl slots("glm53", engine.port());
  gateway::Gateway gw(reg, store, slots, {});
  gw.start();
  // The head announces 10 MB and no body follows: the answer must not wait for it (the server's
  // header timeout is 30 s; this socket gives up after 10 s).
  boost::asio::io_context ioc;
  boost::asio::ip::tcp::socket s(ioc);
  s.connect({boost::asio::ip::make_address("127.0.0.1"), static_cast<unsigned short>(gw.port())});
  boost::asio::write(s, boost::asio::buffer(std::string(
                            "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer wrong\r\n"
                            "Content-Type: application/json\r\nContent-Length: 10000000\r\n\r\n")));
  struct timeval tv{10, 0};
  ::setsockopt(s.native_handle(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  std::string got;
  char buf[4096];
  boost::system::error_code ec;
  while (!ec && got.find("invalid_api_key") == std::string::npos) got.append(buf, s.read_some(boost::asio::buffer(buf), ec));
  CAPTURE(got);
  CHECK(got.rfind("HTTP/1.1 401", 0) == 0);
  CHECK(got.find("invalid API key") != std::string::npos);
  CHECK(store.count_requests("/v1/chat/completions") == 0);
}

TEST_CASE("Host, Origin and Content-Type are enforced on the data plane") {
  Rig rig;
  auto get_with = [&](const std::string& path, http::Headers h) {
    http::ClientRequest r;
    r.port = rig.gw.port();
    r.target = path;
    r.headers = std::move(h);
    return http::fetch(r);
  };
  // DNS rebinding: a page on rebind.example reads /v1/models only if the Host check lets it.
  auto rebound = get_with("/v1/models", {{"Host", "rebind.example:8090"}});
  CHECK(rebound.status == 403);
  CHECK(json::parse(rebound.body)["error"]["code"] == "host_not_allowed");
  auto foreign = get_with("/v1/models", {{"Origin", "https://evil.example"}});
  CHECK(foreign.status == 403);
  CHECK(json::parse(foreign.body)["error"]["code"] == "origin_not_allowed");
  CHECK(get_with("/v1/models", {{"Origin", "http://localhost:3000"}}).status == 200);
  // A form post (text/plain needs no CORS preflight) never reaches the engine.
  http::ClientRequest form;
  form.port = rig.gw.port();
  form.method = "POST";
  form.target = "/v1/chat/completions";
  form.content_type = "text/plain";
  form.body = chat();
  auto f = http::fetch(form);
  CHECK(f.status == 415);
  CHECK(json::parse(f.body)["error"]["code"] == "unsupported_media_type");
  CHECK(rig.engine.requests() == 0);
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
  gateway::GatewayOptions opt;
  opt.admin_token = "adm-test";
  gateway::Gateway gw(reg, store, slots, opt);
  gw.add_route("POST", "/admin/switch", [](http::Request req, std::shared_ptr<http::Responder> res) {
    res->send(202, "application/json", R"({"accepted":)" + req.body + "}");
  });
  CHECK_THROWS_AS(gw.add_route("GET", "/v1/secret", nullptr), std::invalid_argument);
  gw.start();
  http::ClientRequest r;
  r.port = gw.port();
  r.method = "POST";
  r.target = "/admin/switch";
  r.body = "1";
  auto anonymous = http::fetch(r);  // no admin token: refused before the handler
  CHECK(anonymous.status == 401);
  CHECK(json::parse(anonymous.body)["error"]["code"] == "admin_credential_required");
  r.headers = {{"Authorization", "Bearer adm-test"}};
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
