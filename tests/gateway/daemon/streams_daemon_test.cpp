// Stream endings and deadlines through a real daemon: a stream policy that fails ends the stream
// at once and cancels the engine; a drain that expires says the switch ended the stream; a
// non-streaming request has its own total deadline; the daemon listens while it adopts the
// engine a previous daemon left.
#include <doctest/doctest.h>

#include <atomic>
#include <thread>

#include "tests/gateway/daemon/daemon_rig.hpp"

using namespace sdtest::daemon;

namespace {

const json kReadFileTools = json::array(
    {{{"type", "function"},
      {"function",
       {{"name", "read_file"},
        {"parameters", {{"type", "object"}, {"properties", {{"path", {{"type", "string"}}}}}, {"required", {"path"}}}}}}}});

}  // namespace

TEST_CASE("daemon: a tool call the policies cannot repair ends the stream at once and cancels the engine") {
  Daemon d({fake_model("a", "[models.a.policies]\nsanitize_tool_tags = true\n"), "a"});
  // Output first (the client's stream starts), then a call to an undeclared tool, then 10 s more.
  json pieces = json::array({piece(sse(role_chunk())), piece(sse(content_chunk("Let me look. ")))});
  pieces.push_back(piece(sse(tool_chunk("{\"pa", "no_such_tool", "call_1"))));
  for (int i = 0; i < 40; ++i) pieces.push_back(piece(sse(content_chunk("more ")), 250));
  pieces.push_back(piece(sse(finish_chunk("tool_calls"))));
  pieces.push_back(piece(sse_text("[DONE]")));
  d.script("unknown_tool", {{"pieces", pieces}});

  auto r = d.stream(chat_body("a-served", script_messages("unknown_tool"), true, {{"tools", kReadFileTools}}));
  CAPTURE(r.raw);
  CHECK(r.status == 200);
  CHECK(r.delta_text() == "Let me look. ");
  REQUIRE(r.error().is_object());
  CHECK(r.error()["code"] == "tool_call_unknown_name");
  CHECK_FALSE(r.done());
  CHECK(r.total_ms < 4000);  // the engine's answer would have run 10 s
  // The engine saw the gateway hang up long before its script's end.
  REQUIRE(sdtest::wait_for([&] { return d.script_report("unknown_tool").is_object(); }, 5000));
  auto report = d.script_report("unknown_tool");
  CHECK(report["client_gone"] == true);
  CHECK(report["written"].get<int>() < report["pieces"].get<int>() - 5);
  CHECK(report["ms"].get<double>() < 5000);
  CHECK(d.in_flight_settles());
  d.check_still_serving("a-served");
}

TEST_CASE("daemon: a drain that expires tells the client the switch ended its stream (model_switched)") {
  Daemon d({fake_model("a", "drain_timeout_s = 1\n") + fake_model("b", "drain_timeout_s = 1\n"), "a"});
  std::vector<json> evs;
  for (int i = 0; i < 60; ++i) evs.push_back(content_chunk("tok "));
  d.script("long_answer", stream_script(evs, "stop", 200));  // 12 s of tokens

  std::atomic<bool> started{false};
  Received r;
  std::thread client([&] {
    r = d.stream(chat_body("a-served", script_messages("long_answer"), true), [&](const Received& so_far) {
      if (!so_far.data.empty()) started = true;
      return true;
    });
  });
  REQUIRE(sdtest::wait_for([&] { return started.load(); }, 10000));
  auto sw = d.cli("switch b");
  client.join();
  CAPTURE(sw.out);
  CAPTURE(r.raw);
  CHECK(sw.rc == 0);
  CHECK(sdtest::contains(sw.out, "drain timeout"));
  CHECK(r.status == 200);
  REQUIRE(r.error().is_object());
  CHECK(r.error()["code"] == "model_switched");
  CHECK(sdtest::contains(r.error()["message"].get<std::string>(), "'b'"));
  CHECK_FALSE(r.done());
  CHECK(r.total_ms < 10000);
  CHECK(d.wait_model("b", 10000));
  CHECK(d.in_flight_settles());
  CHECK(d.metric("servedeck_request_errors_total{model=\"a\",code=\"model_switched\"}") == 1);

  // `servedeck stop` with a stream in flight: the same, as model_stopped.
  started = false;
  std::thread client2([&] {
    r = d.stream(chat_body("b-served", script_messages("long_answer"), true), [&](const Received& so_far) {
      if (!so_far.data.empty()) started = true;
      return true;
    });
  });
  REQUIRE(sdtest::wait_for([&] { return started.load(); }, 10000));
  auto st = d.cli("stop");
  client2.join();
  CAPTURE(st.out);
  CAPTURE(r.raw);
  CHECK(st.rc == 0);
  REQUIRE(r.error().is_object());
  CHECK(r.error()["code"] == "model_stopped");
  CHECK_FALSE(r.done());
  CHECK(d.in_flight_settles());
}

TEST_CASE("daemon: a non-streaming request has its own total deadline (request_timeout_s)") {
  // first_byte_timeout_ms is its 10-minute default: it no longer bounds a non-streamed answer.
  Daemon d({fake_model("a", "request_timeout_s = 1\n"), "a"});
  d.script("slow_body", body_script({{"content", "late"}}, "stop", 4000));
  auto t0 = std::chrono::steady_clock::now();
  auto r = d.post("/v1/chat/completions", chat_body("a-served", script_messages("slow_body"), false));
  double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  CAPTURE(r.body);
  CHECK(r.status == 504);
  auto j = json::parse(r.body, nullptr, false);
  REQUIRE(j.is_object());
  CHECK(j["error"]["code"] == "upstream_request_timeout");
  CHECK(sdtest::contains(j["error"]["message"].get<std::string>(), "request_timeout_s = 1 s"));
  CHECK(ms < 3500);

  // A stream is not bound by it: 2 s of tokens pass.
  d.script("slow_stream", stream_script({content_chunk("a"), content_chunk("b"), content_chunk("c")}, "stop", 700));
  auto s = d.stream(chat_body("a-served", script_messages("slow_stream"), true));
  CHECK(s.status == 200);
  CHECK(s.delta_text() == "abc");
  CHECK(s.done());
}

TEST_CASE("daemon: it listens while it adopts the engine a previous daemon left, answering 503 + Retry-After") {
  Daemon d({fake_model("a", "", ", \"--health-fail-file\", \"{state_dir}/../health-fail\""), ""});
  auto sw = d.cli("switch a");
  REQUIRE_MESSAGE(sw.rc == 0, sw.out);
  // The daemon dies without stopping its engine; the engine then stops answering /health.
  std::ofstream(d.dir() + "/health-fail") << "loading\n";
  d.kill_hard();

  d.start(8000);  // daemon.json appears once the gateway listens, long before the adoption ends
  auto h = d.health();
  CAPTURE(h.dump());
  CAPTURE(d.log());
  CHECK(h["recovering"] == true);
  auto busy = d.post("/v1/chat/completions", chat_body("a-served", script_messages("x"), false));
  CHECK(busy.status == 503);
  CHECK(busy.headers.count("retry-after") == 1);
  auto j = json::parse(busy.body, nullptr, false);
  REQUIRE(j.is_object());
  CHECK(j["error"]["code"] == "slot_recovering");

  fs::remove(d.dir() + "/health-fail");
  REQUIRE_MESSAGE(d.wait_model("a", 20000), d.log());
  CHECK(sdtest::contains(d.log(), "adopted a: ready"));
  d.check_still_serving("a-served");
}
