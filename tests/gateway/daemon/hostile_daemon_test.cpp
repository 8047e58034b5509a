// Hostile input against a real daemon: from clients (bodies, headers, methods, connections) and
// from the engine (bytes on the stream). Each case checks that the daemon answers sanely — a
// status and an OpenAI error envelope, or an error event, in bounded time — and then still
// serves a normal request.
#include <doctest/doctest.h>

#include <atomic>
#include <cstdint>
#include <fstream>
#include <sstream>
#include <thread>

#include "tests/gateway/daemon/daemon_rig.hpp"

using namespace sdtest::daemon;

namespace {

// note: the policies that parse and re-serialise echoed tool-call arguments are on, so hostile
// argument text reaches them.
const std::string kPolicies =
    "[models.h.policies]\nsanitize_tool_tags = true\ncoerce_tool_argument_types = true\nrestore_reasoning = true\n";

Daemon::Options hostile() { return {fake_model("h", kPolicies), "h"}; }

const json kTools = json::array(
    {{{"type", "function"},
      {"function",
       {{"name", "read_file"},
        {"parameters", {{"type", "object"}, {"properties", {{"path", {{"type", "string"}}}}}, {"required", {"path"}}}}}}}});

/// True when `s` is well-formed UTF-8 (RFC 3629: no overlongs, no surrogates, at most U+10FFFF).
bool valid_utf8(std::string_view s) {
  static constexpr uint32_t k_min[] = {0, 0x80, 0x800, 0x10000};  // smallest code point per length
  std::size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    std::size_t n = 0;  // continuation bytes
    uint32_t cp = c;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xe0) == 0xc0) {
      n = 1, cp = c & 0x1f;
    } else if ((c & 0xf0) == 0xe0) {
      n = 2, cp = c & 0x0f;
    } else if ((c & 0xf8) == 0xf0) {
      n = 3, cp = c & 0x07;
    } else {
      return false;
    }
    if (i + n >= s.size()) return false;
    for (std::size_t k = 1; k <= n; ++k) {
      const auto cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xc0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3f);
    }
    if (cp < k_min[n] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return false;
    i += n + 1;
  }
  return true;
}

/// A string holding the bytes of a literal, NULs included.
template <std::size_t N>
std::string bytes(const char (&literal)[N]) {
  return std::string(literal, N - 1);
}

/// The reply is an OpenAI error envelope with `status`, or (when `code` is given) that code too.
void check_envelope(const servedeck::http::ClientResponse& r, int status, const std::string& code = "") {
  CAPTURE(r.body);
  CHECK(r.status == status);
  CHECK(valid_utf8(r.body));
  auto j = json::parse(r.body, nullptr, false);
  REQUIRE(j.is_object());
  REQUIRE(j.contains("error"));
  CHECK(j["error"]["message"].is_string());
  if (!code.empty()) CHECK(j["error"]["code"] == code);
}

/// An assistant turn echoing one read_file call with `arguments` (text as the client sends it).
json echoed_call(const std::string& arguments) {
  return json::array({{{"role", "user"}, {"content", "read it"}},
                      {{"role", "assistant"},
                       {"content", ""},
                       {"tool_calls", json::array({{{"id", "call_h1"},
                                                    {"type", "function"},
                                                    {"function", {{"name", "read_file"}, {"arguments", arguments}}}}})}},
                      {{"role", "tool"}, {"tool_call_id", "call_h1"}, {"content", "ok"}},
                      {{"role", "user"}, {"content", "script:after_history"}}});
}

/// d.post that reports a request with no answer (a timeout, the connection closed: the daemon
/// died) as status 0 with the client's error as its body, so the case goes on to check the daemon.
servedeck::http::ClientResponse post_or_nothing(Daemon& d, const std::string& body, int timeout_ms) {
  try {
    return d.post("/v1/chat/completions", body, timeout_ms);
  } catch (const std::exception& e) {
    servedeck::http::ClientResponse r;
    r.body = std::string("no answer: ") + e.what();
    return r;
  }
}

double since_ms(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

// --- client input ----------------------------------------------------------------------------

TEST_CASE("hostile: deeply nested JSON in an echoed tool call's arguments") {
  Daemon d(hostile());
  d.script("after_history", body_script({{"content", "ok"}}));
  const int depth = 100000;
  for (const std::string& args : {std::string(depth, '[') + std::string(depth, ']'),
                                  "{\"path\": " + std::string(depth, '[') + std::string(depth, ']') + "}",
                                  std::string(depth, '{')}) {
    auto r = post_or_nothing(d, chat_body("h-served", echoed_call(args), false, {{"tools", kTools}}), 20000);
    CAPTURE(r.body.substr(0, 300));
    CHECK((r.status == 200 || r.status == 400));
    CHECK(valid_utf8(r.body));
    REQUIRE_MESSAGE(d.alive(), d.log());
  }
  // From the engine: a streamed call with nested arguments (remembered by restore_reasoning,
  // repaired by the tool-call policies), and an event that is itself nested that deep.
  const std::string nested = std::string(depth, '[') + std::string(depth, ']');
  d.script("nested_args", stream_script({reasoning_chunk("Reading."), tool_chunk(nested, "read_file", "call_n1")}, "tool_calls"));
  auto a = d.stream(chat_body("h-served", script_messages("nested_args"), true, {{"tools", kTools}}));
  CAPTURE(a.client_error);
  CHECK(a.status == 200);
  CHECK((a.done() || a.error().is_object()));
  REQUIRE_MESSAGE(d.alive(), d.log());
  d.script("nested_event", {{"pieces", json::array({piece(sse(role_chunk())), piece(sse(content_chunk("a "))),
                                                    piece(sse_text(nested))})}});
  auto e = d.stream(chat_body("h-served", script_messages("nested_event"), true));
  CHECK(e.status == 200);
  REQUIRE(e.error().is_object());
  CHECK(e.error()["code"] == "engine_bad_event");
  REQUIRE_MESSAGE(d.alive(), d.log());
  d.check_still_serving("h-served");
}

TEST_CASE("hostile: 1 MiB of whitespace in argument values, echoed and streamed, answered in bounded time") {
  Daemon d(hostile());
  d.script("after_history", body_script({{"content", "ok"}}));
  const std::string ws(1 << 20, ' ');
  auto echoed = [&](const std::string& args) {
    auto t0 = std::chrono::steady_clock::now();
    auto r = post_or_nothing(d, chat_body("h-served", echoed_call(args), false, {{"tools", kTools}}), 20000);
    CAPTURE(r.body.substr(0, 300));
    CHECK((r.status == 200 || r.status == 400));
    CHECK(since_ms(t0) < 5000);
  };
  SUBCASE("echoed: before a string value") { echoed("{\"path\":" + ws + "\"/x\"}"); }
  SUBCASE("echoed: inside a string value") { echoed("{\"path\": \"" + ws + "/x\"}"); }
  SUBCASE("echoed: before a key with leaked markup") { echoed("{" + ws + "\"path</arg_key>\": \"/x\"}"); }
  SUBCASE("streamed by the engine in 64 KiB deltas") {
    std::vector<json> deltas = {tool_chunk("{\"path\": \"", "read_file", "call_w1")};
    for (int i = 0; i < 16; ++i) deltas.push_back(tool_chunk(std::string(64 * 1024, ' ')));
    deltas.push_back(tool_chunk("/x\"}"));
    d.script("ws_stream", stream_script(deltas, "tool_calls"));
    auto t0 = std::chrono::steady_clock::now();
    auto s = d.stream(chat_body("h-served", script_messages("ws_stream"), true, {{"tools", kTools}}), nullptr,
                      "/v1/chat/completions", 20000);
    CAPTURE(s.client_error);
    CHECK(s.status == 200);
    CHECK((s.done() || s.error().is_object()));
    CHECK(since_ms(t0) < 5000);
  }
  d.check_still_serving("h-served");
}

TEST_CASE("hostile: invalid UTF-8 and NUL bytes in request bodies") {
  Daemon d(hostile());
  const std::string bad = "{\"model\":\"h-served\",\"messages\":[{\"role\":\"user\",\"content\":\"caf\xc3\x28 \xff\xfe\"}]}";
  check_envelope(d.post("/v1/chat/completions", bad), 400, "invalid_json");
  const std::string overlong = "{\"model\":\"h-served\",\"messages\":[{\"role\":\"user\",\"content\":\"\xc0\xaf\"}]}";
  check_envelope(d.post("/v1/chat/completions", overlong), 400, "invalid_json");
  check_envelope(d.post("/v1/chat/completions", bytes("{\"model\":\"h-\0served\",\"messages\":[]}")), 400, "invalid_json");
  check_envelope(d.post("/v1/responses", "{\"model\":\"h-served\",\"input\":\"\xed\xa0\x80\"}"), 400, "invalid_json");
  // An escaped NUL is valid JSON: it reaches the engine as the character it is.
  d.script("nul", body_script({{"content", "ok"}}));
  json msgs = json::array({{{"role", "user"}, {"content", std::string("a\0b", 3)}}, {{"role", "user"}, {"content", "script:nul"}}});
  auto r = d.post("/v1/chat/completions", chat_body("h-served", msgs, false));
  CHECK(r.status == 200);
  json e = d.engine_request("nul");
  REQUIRE(e.is_object());
  CHECK(e["messages"][0]["content"] == std::string("a\0b", 3));
  d.check_still_serving("h-served");
}

TEST_CASE("hostile: a body with 100,000 messages") {
  Daemon d(hostile());
  d.script("many", body_script({{"content", "ok"}}));
  json msgs = json::array();
  for (int i = 0; i < 100000; ++i) msgs.push_back({{"role", i % 2 ? "assistant" : "user"}, {"content", "x"}});
  msgs.push_back({{"role", "user"}, {"content", "script:many"}});
  auto t0 = std::chrono::steady_clock::now();
  auto r = d.post("/v1/chat/completions", chat_body("h-served", msgs, false), 60000);
  CAPTURE(r.body.substr(0, 300));
  CHECK((r.status == 200 || r.status == 400 || r.status == 413));
  // note: linear work; a Debug build (daemon and fake engine both parse and re-serialise the
  // 3 MB body) took 5.7 s, so the bound is loose for sanitizer builds and tight for a quadratic.
  CHECK(since_ms(t0) < 30000);
  d.check_still_serving("h-served");
}

TEST_CASE("hostile: wrong content types") {
  Daemon d(hostile());
  d.script("typed", body_script({{"content", "ok"}}));
  const std::string body = chat_body("h-served", script_messages("typed"), false);
  for (const std::string type : {"text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", ""}) {
    CAPTURE(type);
    auto r = d.post("/v1/chat/completions", body, 10000, type);
    CAPTURE(r.body);
    // A POST body is JSON only when it says so (a browser page cannot send that cross-origin
    // without a CORS preflight): refused from the head with an envelope, never a server error.
    check_envelope(r, 415, "unsupported_media_type");
  }
  check_envelope(d.post("/v1/chat/completions", "model=h-served&messages=hi", 10000, "application/x-www-form-urlencoded"),
                 415, "unsupported_media_type");
  CHECK(d.post("/v1/chat/completions", body, 10000, "Application/JSON; charset=utf-8").status == 200);
  d.check_still_serving("h-served");
}

TEST_CASE("hostile: duplicate keys are read one way, the same by the gateway and the engine it forwards to") {
  Daemon d(hostile());
  d.script("dup", body_script({{"content", "ok"}}));
  auto dup = d.post("/v1/chat/completions",
                    R"({"model":"nope","model":"h-served","stream":true,"stream":false,)"
                    R"("messages":[{"role":"user","content":"hi","content":"script:dup"}]})");
  CAPTURE(dup.body);
  if (dup.status == 200) {
    json e = d.engine_request("dup");
    REQUIRE(e.is_object());
    CHECK(e["model"] == "h-served");
    CHECK(e["stream"] == false);
    CHECK(json::parse(dup.body)["object"] == "chat.completion");
  } else {
    check_envelope(dup, 400);
  }
  d.check_still_serving("h-served");
}

TEST_CASE("hostile: HEAD and OPTIONS on every route never run a handler's action") {
  Daemon d(hostile());
  const std::vector<std::string> routes = {"/v1/chat/completions", "/v1/completions", "/v1/responses",
                                           "/v1/messages", "/v1/messages/count_tokens", "/v1/models",
                                           "/v1/models/h-served", "/health", "/metrics", "/admin/switch",
                                           "/admin/stop", "/admin/status", "/admin/logs", "/admin/preflight",
                                           "/admin/models", "/nope"};
  const std::size_t engine_requests = d.engine_log().size();
  for (const auto& path : routes) {
    for (const std::string method : {"HEAD", "OPTIONS"}) {
      CAPTURE(method + " " + path);
      RawConn c(d.port());
      REQUIRE(c.send(method + " " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\n\r\n"));
      auto r = method == "HEAD" ? c.read(1500, [](const std::string& b) { return b.find("\r\n\r\n") != std::string::npos; })
                                : c.read_response(3000);
      CAPTURE(r.bytes);
      CHECK(r.status() >= 200);
      CHECK(r.status() < 500);
      if (method == "HEAD") {
        auto rest = c.read(300);  // nothing follows the head of a HEAD response
        CHECK(r.bytes.substr(r.bytes.find("\r\n\r\n") + 4).empty());
        CHECK(rest.bytes.empty());
      }
    }
  }
  CHECK(d.wait_model("h", 2000));  // neither /admin/stop nor /admin/switch ran
  CHECK(d.engine_log().size() == engine_requests);  // no completion reached the engine
  d.check_still_serving("h-served");
}

TEST_CASE("hostile: slow-loris headers, an endless header line and a short body do not stall others") {
  Daemon d(hostile());
  std::vector<std::unique_ptr<RawConn>> slow;
  for (int i = 0; i < 48; ++i) {
    slow.push_back(std::make_unique<RawConn>(d.port()));
    REQUIRE(slow.back()->send("POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: "));
  }
  std::atomic<bool> stop{false};
  std::thread drip([&] {
    while (!stop) {
      for (auto& c : slow) c->send("a");
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  });
  // Meanwhile, ordinary requests are served at once.
  for (int i = 0; i < 3; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    CHECK(d.get("/health", 3000).status == 200);
    CHECK(since_ms(t0) < 2000);
  }
  d.check_still_serving("h-served");
  stop = true;
  drip.join();
  // One header line of 1 MiB: refused (431 or 400) and closed, not buffered without bound.
  {
    RawConn c(d.port());
    c.send("GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + std::string(1 << 20, 'a') + "\r\n\r\n");
    auto r = c.read(5000);
    CHECK((r.status() == 431 || r.status() == 400 || (r.status() == 0 && r.closed)));
  }
  // A body shorter than its Content-Length, then the client goes away.
  {
    RawConn c(d.port());
    c.send("POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
           "Content-Length: 100000\r\n\r\n{\"model\":");
  }
  // Garbage instead of HTTP.
  {
    RawConn c(d.port());
    c.send(bytes("\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03 TLS hello?\r\n\r\n"));
    auto r = c.read(3000);
    CHECK((r.status() == 400 || r.closed));
  }
  slow.clear();
  d.check_still_serving("h-served");
}

TEST_CASE("hostile: more connections than the descriptor limit allows get 503, not a stuck accept") {
  // Regression: max_connections 4096 was never reconciled with RLIMIT_NOFILE, so under a small
  // soft limit accept() failed with EMFILE and clients waited in the backlog; the 503 never came.
  // Hard 300, soft 100: the daemon raises soft to 300 and keeps (300 − 256) / 2 = 22 connections.
  Daemon::Options o = hostile();
  o.shell_prefix = "ulimit -Sn 100 && ulimit -Hn 300";
  Daemon d(o);
  std::stringstream log;
  log << std::ifstream(d.dir() + "/daemon.log").rdbuf();
  CAPTURE(log.str().substr(0, 2000));
  CHECK(log.str().find("descriptors: soft limit 100 raised to 300 (hard 300); max_connections 22") != std::string::npos);
  std::vector<std::unique_ptr<RawConn>> conns;
  for (int i = 0; i < 120; ++i) conns.push_back(std::make_unique<RawConn>(d.port()));
  int busy = 0, silent = 0;
  for (auto& c : conns) {
    auto r = c->read(100);
    if (r.status() == 503 && r.bytes.find("too_many_connections") != std::string::npos) ++busy;
    else if (r.bytes.empty()) ++silent;  // held: accepted and waiting for a request
  }
  CAPTURE(busy);
  CAPTURE(silent);
  CHECK(busy >= 120 - 22);
  CHECK(busy + silent == 120);
  conns.clear();
  REQUIRE_MESSAGE(d.alive(), d.log());
  d.check_still_serving("h-served");
}

TEST_CASE("hostile: a client that disconnects mid-stream is recorded once and the engine stops") {
  Daemon d(hostile());
  std::vector<json> toks;
  for (int i = 0; i < 40; ++i) toks.push_back(content_chunk("t" + std::to_string(i) + " "));
  d.script("long", stream_script(toks, "stop", 100));
  auto r = d.stream(chat_body("h-served", script_messages("long"), true), [](const Received& so_far) {
    return so_far.data.size() < 3;  // read three events, then hang up
  });
  CHECK(r.status == 200);
  REQUIRE(sdtest::wait_for([&] { return d.script_report("long").is_object(); }, 5000));
  auto report = d.script_report("long");
  CHECK(report["client_gone"] == true);
  CHECK(report["written"].get<int>() < 20);
  REQUIRE(sdtest::wait_for([&] { return d.metric("servedeck_requests_total{model=\"h\",status=\"499\"}") == 1; }, 3000));
  CHECK(d.in_flight_settles());
  CHECK(d.metric("servedeck_request_errors_total{model=\"h\",code=\"client_disconnected\"}") == 1);
  d.check_still_serving("h-served");
  CHECK(d.in_flight_settles());
  CHECK(d.metric("servedeck_requests_total{model=\"h\",status=\"200\"}") == 1);  // the warm-up is no client request
}

// The Anthropic Messages routes: hostile_messages_daemon_test.cpp.

TEST_CASE("hostile engine: invalid UTF-8 inside an event, and a character cut across reads") {
  Daemon d(hostile());
  const std::string open = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"";
  const std::string close = "\"},\"finish_reason\":null}]}\n\n";
  // "café 日本" with each multi-byte character split between two pieces (two engine writes).
  d.script("cut_char", {{"pieces", json::array({piece(sse(role_chunk())), piece(open + "caf"), hex_piece("c3", 30),
                                                hex_piece("a9", 30), piece(" "), hex_piece("e697", 30), hex_piece("a5e6", 30),
                                                hex_piece("9cac", 30), piece(close), piece(sse(finish_chunk())),
                                                piece(sse_text("[DONE]"))})}});
  auto ok = d.stream(chat_body("h-served", script_messages("cut_char"), true));
  CAPTURE(ok.raw);
  CHECK(ok.status == 200);
  CHECK(ok.delta_text() == "caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac");
  CHECK(ok.done());

  d.script("bad_utf8", {{"pieces", json::array({piece(sse(role_chunk())), piece(sse(content_chunk("fine "))),
                                                piece(open + "bad "), hex_piece("fffec328"), piece(close),
                                                piece(sse(finish_chunk())), piece(sse_text("[DONE]"))})}});
  auto bad = d.stream(chat_body("h-served", script_messages("bad_utf8"), true));
  CAPTURE(bad.raw);
  CHECK(bad.status == 200);
  CHECK(bad.delta_text() == "fine ");
  REQUIRE(bad.error().is_object());
  CHECK(bad.error()["code"] == "engine_bad_event");
  CHECK_FALSE(bad.done());
  CHECK(valid_utf8(bad.raw));
  d.check_still_serving("h-served");
}

TEST_CASE("hostile engine: an SSE event over the size limit ends the stream with an error event") {
  Daemon d(hostile());
  d.script("huge_event", {{"pieces", json::array({piece(sse(role_chunk())), piece(sse(content_chunk("start "))),
                                                  piece("data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\""),
                                                  {{"text", "x"}, {"repeat", 17 * 1024 * 1024}}})},
                          {"ending", "hang"}});
  auto r = d.stream(chat_body("h-served", script_messages("huge_event"), true));
  CAPTURE(r.raw.substr(0, 2000));
  CHECK(r.status == 200);
  CHECK(r.delta_text() == "start ");
  REQUIRE(r.error().is_object());
  CHECK(r.error()["code"] == "engine_event_too_large");
  CHECK_FALSE(r.done());
  REQUIRE(sdtest::wait_for([&] { return d.script_report("huge_event").is_object(); }, 10000));
  CHECK(d.script_report("huge_event")["client_gone"] == true);
  CHECK(d.in_flight_settles());
  d.check_still_serving("h-served");
}

TEST_CASE("hostile engine: bytes that are no SSE at all") {
  Daemon d(hostile());
  // Bytes that are no SSE events at all, then the end of the body: nothing to forward.
  d.script("garbage", {{"pieces", json::array({piece("HTTP/1.1 200 OK\r\n{}{]]\n"), hex_piece("00010203fffe0a0a"),
                                               piece("event\nretry: x\n\n")})}});
  auto g = d.post("/v1/chat/completions", chat_body("h-served", script_messages("garbage"), true));
  check_envelope(g, 502, "upstream_closed");
  CHECK(d.in_flight_settles());
  d.check_still_serving("h-served");
}

TEST_CASE("hostile engine: a close inside an event, and data: that is not JSON") {
  Daemon d(hostile());

  // Output, then the connection closes in the middle of an event.
  d.script("cut_event", {{"pieces", json::array({piece(sse(role_chunk())), piece(sse(content_chunk("partial "))),
                                                 piece("data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"cut he")})},
                         {"ending", "cut"}});
  auto c = d.stream(chat_body("h-served", script_messages("cut_event"), true));
  CAPTURE(c.raw);
  CHECK(c.status == 200);
  CHECK(c.delta_text() == "partial ");
  REQUIRE(c.error().is_object());
  CHECK(c.error()["code"] == "upstream_closed");
  CHECK_FALSE(c.done());

  // A data line that is not JSON, before any output: a real status.
  d.script("not_json", {{"pieces", json::array({piece(sse(role_chunk())), piece(sse_text("hello, I am not JSON"))})}});
  check_envelope(d.post("/v1/chat/completions", chat_body("h-served", script_messages("not_json"), true)), 502,
                 "engine_bad_event");
  // The same after output: an error event, no [DONE].
  d.script("not_json_late", {{"pieces", json::array({piece(sse(role_chunk())), piece(sse(content_chunk("a "))),
                                                     piece(sse_text("{\"choices\": [}"))})}});
  auto late = d.stream(chat_body("h-served", script_messages("not_json_late"), true));
  CHECK(late.delta_text() == "a ");
  REQUIRE(late.error().is_object());
  CHECK(late.error()["code"] == "engine_bad_event");

  CHECK(d.in_flight_settles());
  d.check_still_serving("h-served");
}
