// Hostile input on the Anthropic Messages routes against a real daemon: what a client sends to
// /v1/messages and /v1/messages/count_tokens, and what an engine streams that the Messages bridge
// must translate without losing or inventing anything. The rest of the hostile suite is
// hostile_daemon_test.cpp.
#include <doctest/doctest.h>

#include <string>

#include "tests/gateway/daemon/daemon_rig.hpp"

using namespace sdtest::daemon;

namespace {

// note: the same policies as the main hostile suite, so hostile argument text reaches them.
const std::string kPolicies =
    "[models.h.policies]\nsanitize_tool_tags = true\ncoerce_tool_argument_types = true\nrestore_reasoning = true\n";

Daemon::Options hostile() { return {fake_model("h", kPolicies), "h"}; }

/// An Anthropic error envelope {"type":"error","error":{"type":TYPE,"message"}} with `status`.
void check_anthropic_error(const servedeck::http::ClientResponse& r, int status, const std::string& type) {
  CAPTURE(r.body.substr(0, 300));
  CHECK(r.status == status);
  json j = json::parse(r.body, nullptr, false);
  REQUIRE(j.is_object());
  CHECK(j["type"] == "error");
  CHECK(j["error"]["type"] == type);
  CHECK(j["error"]["message"].is_string());
}

}  // namespace

TEST_CASE("hostile: an empty or missing model on the Messages routes") {
  Daemon d(hostile());
  const json msgs = json::array({{{"role", "user"}, {"content", "hi"}}});
  for (const std::string path : {"/v1/messages/count_tokens", "/v1/messages"}) {
    CAPTURE(path);
    // An empty string names no configured model: Anthropic's not_found_error, like any unknown id.
    servedeck::http::ClientResponse empty;
    try {
      empty = d.post(path, json{{"model", ""}, {"max_tokens", 8}, {"messages", msgs}}.dump(), 10000);
    } catch (const std::exception& e) {
      empty.body = std::string("no answer (the daemon died?): ") + e.what();
    }
    check_anthropic_error(empty, 404, "not_found_error");
    REQUIRE_MESSAGE(d.alive(), d.log());
    check_anthropic_error(d.post(path, json{{"max_tokens", 8}, {"messages", msgs}}.dump()), 400, "invalid_request_error");
    check_anthropic_error(d.post(path, json{{"model", 7}, {"max_tokens", 8}, {"messages", msgs}}.dump()), 400,
                          "invalid_request_error");
    REQUIRE_MESSAGE(d.alive(), d.log());
  }
  d.check_still_serving("h-served");
}

TEST_CASE("hostile: what the bridges drop is logged bounded, and a client cannot forge log lines") {
  Daemon d(hostile());
  d.script("noted", body_script({{"content", "ok"}}));
  const std::string forged = "FORGED servedeck: stopped";
  // Thousands of blocks and items of unknown types, each type carrying a line break and a fake
  // log line: every one is a dropped-with-a-note item.
  json blocks = json::array();
  json items = json::array();
  for (int i = 0; i < 5000; ++i) {
    blocks.push_back({{"type", "x\n" + forged}});
    items.push_back({{"type", "y\r\n" + forged}});
  }
  blocks.push_back({{"type", "text"}, {"text", "script:noted"}});
  items.push_back({{"type", "message"}, {"role", "user"}, {"content", "script:noted"}});
  const auto before = fs::file_size(d.dir() + "/daemon.log");
  auto m = d.post("/v1/messages",
                  json{{"model", "h-served"}, {"max_tokens", 8}, {"messages", {{{"role", "user"}, {"content", blocks}}}}}.dump());
  CHECK(m.status == 200);
  auto r = d.post("/v1/responses", json{{"model", "h-served"}, {"input", items}}.dump());
  CHECK(r.status == 200);
  std::ifstream in(d.dir() + "/daemon.log");
  in.seekg(static_cast<std::streamoff>(before));
  int noted = 0, forged_lines = 0, carriage_returns = 0;
  for (std::string line; std::getline(in, line);) {
    forged_lines += line.rfind("FORGED", 0) == 0 ? 1 : 0;
    carriage_returns += line.find('\r') != std::string::npos ? 1 : 0;
    if (line.find("(h-served): ") != std::string::npos) ++noted;
  }
  CHECK(forged_lines == 0);
  CHECK(carriage_returns == 0);
  // Eight notes a request, then one line that counts the rest.
  CHECK(noted == 2 * 9);
  CHECK(fs::file_size(d.dir() + "/daemon.log") - before < 16 * 1024);
  d.check_still_serving("h-served");
}

// --- engine output ----------------------------------------------------------------------------

namespace {

/// A streamed Messages request for `model` whose user turn is "script:NAME", with one tool.
std::string messages_stream_body(const std::string& model, const std::string& name) {
  return json{{"model", model},
              {"max_tokens", 64},
              {"stream", true},
              {"messages", {{{"role", "user"}, {"content", "script:" + name}}}},
              {"tools", {{{"name", "write"}, {"input_schema", {{"type", "object"}, {"properties", {{"content", {{"type", "string"}}}}}}}}}}}
      .dump();
}

/// The partial_json of every input_json_delta at content block `index`, joined.
std::string partial_json_at(const Received& r, int index) {
  std::string out;
  for (const auto& e : r.events())
    if (e.value("type", "") == "content_block_delta" && e["index"] == index && e["delta"]["type"] == "input_json_delta")
      out += e["delta"]["partial_json"].get<std::string>();
  return out;
}

}  // namespace

TEST_CASE("hostile engine: content between a tool call's argument fragments reaches a Messages client whole") {
  // No policies: the bridge sees the engine's deltas as they came.
  Daemon d({fake_model("p"), "p"});
  d.script("split_args", stream_script({tool_chunk("{\"content\": ", "write", "call_s1"), content_chunk("\n"),
                                        tool_chunk("\"abc\"}")}, "tool_calls"));
  auto r = d.stream(messages_stream_body("p-served", "split_args"), nullptr, "/v1/messages");
  CAPTURE(r.raw.substr(0, 3000));
  CHECK(r.status == 200);
  REQUIRE_FALSE(r.events().empty());
  CHECK(r.events().back()["type"] == "message_stop");
  CHECK(json::parse(partial_json_at(r, 0), nullptr, false) == json{{"content", "abc"}});

  // Text that closes the block before the rest of the arguments: an error event, no message_stop.
  d.script("late_args", stream_script({tool_chunk("{\"content\": ", "write", "call_s2"), content_chunk("text"),
                                       tool_chunk("\"abc\"}")}, "tool_calls"));
  auto late = d.stream(messages_stream_body("p-served", "late_args"), nullptr, "/v1/messages");
  CAPTURE(late.raw.substr(0, 3000));
  REQUIRE_FALSE(late.events().empty());
  CHECK(late.events().back()["type"] == "error");
  for (const auto& e : late.events()) CHECK(e["type"] != "message_stop");
  d.check_still_serving("p-served");
}

TEST_CASE("hostile engine: tool arguments that are no JSON object reach a Messages client as an error, never input {}") {
  Daemon d({fake_model("p"), "p"});
  const std::string cut = "{\"content\": \"abc";
  d.script("bad_args_body", body_script({{"content", nullptr},
                                         {"tool_calls", json::array({{{"id", "call_b1"}, {"type", "function"},
                                                                      {"function", {{"name", "write"}, {"arguments", cut}}}}})}},
                                        "tool_calls"));
  json body = json::parse(messages_stream_body("p-served", "bad_args_body"));
  body["stream"] = false;
  auto r = d.post("/v1/messages", body.dump());
  CAPTURE(r.body.substr(0, 500));
  CHECK(r.status == 502);
  json e = json::parse(r.body, nullptr, false);
  REQUIRE(e.is_object());
  CHECK(e["error"]["type"] == "api_error");
  CHECK(e["error"]["message"].get<std::string>().find("tool call 'write' (call_b1)") != std::string::npos);

  d.script("bad_args_stream", stream_script({tool_chunk(cut, "write", "call_b2")}, "tool_calls"));
  auto s = d.stream(messages_stream_body("p-served", "bad_args_stream"), nullptr, "/v1/messages");
  CAPTURE(s.raw.substr(0, 2000));
  REQUIRE_FALSE(s.events().empty());
  CHECK(s.events().back()["type"] == "error");
  for (const auto& ev : s.events()) CHECK(ev["type"] != "content_block_stop");
  d.check_still_serving("p-served");
}

