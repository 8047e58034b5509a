// The gateway end to end: a client (common/http) → Gateway → an in-process fake engine
// replaying recorded streams. Asserts exactly what the client receives. This file: streams
// (endings, errors, retries, deadlines, disconnects, backpressure, stop); routes and switching
// are in gateway_routes_test.cpp.
#include "gateway/server/stream_normalizer.hpp"
#include "tests/gateway/server/gateway_rig.hpp"

using namespace servedeck;
using namespace servedeck::test::gateway_rig;

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

TEST_CASE("G09: the retried attempt gets its own first-byte deadline, not the failed attempt's gap") {
  // The retry's engine sends only comments for 3 gaps' time (a long prefill), then answers: the
  // first-byte deadline covers that wait; the failed attempt's error event is no progress of it.
  Rig rig("glm53", 5000, [](registry::Registry& r) {
    r.models[0].first_byte_timeout_ms = 8000;
    r.models[0].max_gap_ms = 500;
  });
  rig.engine.push(test::sse_script({role_ev(), R"({"error":{"code":500,"message":"boom"}})"}));
  Script s;
  for (int i = 0; i < 10; ++i) s.pieces.push_back({": keepalive\n\n", 150});
  s.pieces.push_back({"data: " + role_ev() + "\n\ndata: " + content_ev("ok") + "\n\ndata: " + finish_ev() + "\n\ndata: [DONE]\n\n", 0});
  rig.engine.push(s);
  auto r = stream(rig, chat());
  CAPTURE(r.data);
  CHECK(r.status == 200);
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
    CHECK(json::parse(r.body)["error"]["message"].get<std::string>().rfind("no first byte from the engine within 400 ms (", 0) == 0);
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
    CHECK(r.event(2)["error"]["message"].get<std::string>().rfind("no event from the engine within 300 ms of the last one (", 0) == 0);
    CHECK_FALSE(r.done());
  }
  SUBCASE("TTFT: SSE comments are no first event") {
    Rig rig("glm53", 5000, [](registry::Registry& r) { r.models[0].first_byte_timeout_ms = 400; });
    Script s;
    for (int i = 0; i < 20; ++i) s.pieces.push_back({": keepalive\n\n", 100});  // 2 s of comments
    s.pieces.push_back({"data: " + role_ev() + "\n\n", 0});
    s.ending = Script::Ending::hang;
    rig.engine.push(s);
    auto t0 = std::chrono::steady_clock::now();
    auto r = rig.post("/v1/chat/completions", chat());
    CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(1800));
    CHECK(r.status == 504);
    CHECK(json::parse(r.body)["error"]["code"] == "upstream_first_byte_timeout");
  }
  SUBCASE("gap: one event trickled a byte at a time is no progress") {
    Rig rig("glm53", 5000, [](registry::Registry& r) { r.models[0].max_gap_ms = 300; });
    Script s;
    s.pieces = {{"data: " + role_ev() + "\n\ndata: " + content_ev("a") + "\n\n", 0}};
    const std::string slow = "data: " + content_ev("b") + "\n\n";
    for (char c : slow) s.pieces.push_back({std::string(1, c), 100});  // each byte within the gap
    rig.engine.push(s);
    auto r = stream(rig, chat());
    REQUIRE(r.data.size() == 3);
    CHECK(r.event(2)["error"]["code"] == "upstream_gap_timeout");
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

TEST_CASE("heartbeats continue after the first token whenever nothing was written for heartbeat_ms") {
  Rig rig("glm53", 100);
  Script s;
  s.pieces = {{"data: " + role_ev() + "\n\ndata: " + content_ev("a") + "\n\n", 0},
              {"data: " + content_ev("b") + "\n\n", 800},
              {"data: " + finish_ev() + "\n\ndata: [DONE]\n\n", 0}};
  rig.engine.push(s);
  std::size_t comments_at_a = 0, comments_at_b = 0;
  auto r = stream(rig, chat(), [&](const Received& got) {
    if (got.data.size() >= 2 && comments_at_a == 0) comments_at_a = got.comments.size() + 1;
    if (got.data.size() >= 3 && comments_at_b == 0) comments_at_b = got.comments.size() + 1;
    return true;
  });
  CHECK(r.status == 200);
  CHECK(r.done());
  REQUIRE(comments_at_a > 0);
  REQUIRE(comments_at_b > 0);
  // 800 ms of engine silence after "a", heartbeats every 100 ms of client silence.
  CHECK(comments_at_b - comments_at_a >= 3);
  for (const auto& c : r.comments) CHECK(c == "waiting for the engine's next event");
}

TEST_CASE("an engine stream past what the normaliser keeps ends with stream_too_large, nothing after it, logged") {
  json choices = json::array();
  for (std::size_t i = 0; i <= gateway::k_max_stream_choices; ++i)
    choices.push_back({{"index", i}, {"delta", {{"content", "x"}}}, {"finish_reason", nullptr}});
  const std::string too_many = json{{"id", "c1"}, {"object", "chat.completion.chunk"}, {"choices", choices}}.dump();
  Rig rig;
  rig.engine.push(test::sse_script({role_ev(), content_ev("partial"), too_many, content_ev("never"), "[DONE]"}, 4096));
  // The request asks for that many choices, so every index is in range (engine_chunk.hpp).
  auto r = stream(rig, chat("glm53-flash", true, ",\"n\":" + std::to_string(gateway::k_max_stream_choices + 1)));
  CHECK(r.status == 200);
  REQUIRE(r.data.size() >= 3);
  CHECK(r.event(1)["choices"][0]["delta"]["content"] == "partial");
  CHECK(r.event(r.data.size() - 1)["error"]["code"] == "stream_too_large");
  CHECK_FALSE(r.done());
  // The choices below the bound may pass (the policies forward a chunk's choices one by one); the
  // 257th index and everything after it never reach the client.
  CHECK(r.data.size() <= 2 + gateway::k_max_stream_choices + 1);
  for (std::size_t i = 0; i + 1 < r.data.size(); ++i) CHECK(r.data[i].find("never") == std::string::npos);
  REQUIRE(wait_for([&] { return rig.store.count_requests("/v1/chat/completions") == 1; }));
  CHECK(rig.store.recent_requests(1)[0].error_code == "stream_too_large");
}
