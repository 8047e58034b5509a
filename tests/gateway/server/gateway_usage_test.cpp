// The gateway end to end for G12's last clause: an engine that reports no usage, a client that
// asked for it (fixtures: tests/gateway/server/fixtures/g12_*). What the client receives, what
// the engine was sent, and what the request log keeps (only the engine's own numbers).
#include <cstdio>
#include <sstream>

#include "gateway/server/stream_normalizer.hpp"
#include "tests/gateway/cli/cli_run.hpp"
#include "tests/gateway/server/fixture_files.hpp"
#include "tests/gateway/server/gateway_rig.hpp"

using namespace servedeck;
using namespace servedeck::test::gateway_rig;

namespace {

Script fixture_stream(const std::string& name) {
  Script s;
  s.pieces = test::split_pieces(test::read_gateway_fixture(name), 11);
  return s;
}

std::size_t count_usage_events(const Received& r) {
  std::size_t n = 0;
  for (const auto& d : r.data)
    if (d != "[DONE]" && json::parse(d).contains("usage")) ++n;
  return n;
}

}  // namespace

TEST_CASE("G12 through the gateway: no engine usage, include_usage → one flagged usage chunk") {
  Rig rig;
  rig.engine.push(fixture_stream("g12_no_usage.sse"));
  auto r = stream(rig, test::read_gateway_fixture("g12_request.json"));
  CHECK(r.status == 200);
  REQUIRE(r.data.size() >= 3);
  CHECK(r.done());
  CHECK(count_usage_events(r) == 1);
  auto u = r.event(r.data.size() - 2);
  CHECK(u["choices"] == json::array());
  CHECK(u["object"] == "chat.completion.chunk");
  CHECK(u["model"] == "glm53-flash");
  CHECK(u["usage"]["completion_tokens"] == 6);
  // The prompt estimate is of the body the engine received (cleaned: vendor keys dropped, the
  // parameter-less tool given an empty schema — G12's other clauses).
  auto sent = rig.engine.last_body();
  CHECK_FALSE(sent["tools"][0].contains("cache_control"));
  CHECK(sent["tools"][1]["function"]["parameters"] == json{{"type", "object"}, {"properties", json::object()}});
  CHECK(u["usage"]["prompt_tokens"] == gateway::estimate_request_tokens(sent));
  CHECK(u["usage"]["prompt_tokens"].get<int64_t>() > 0);
  CHECK(u["usage"]["servedeck_estimated"] == true);
  // The request log keeps only what the engine reported: no prompt count; the completion count
  // is the output-chunk fallback it has always used for a stream without usage.
  REQUIRE(wait_for([&] { return rig.store.count_requests("/v1/chat/completions") == 1; }));
  auto row = rig.store.recent_requests(1)[0];
  CHECK(row.prompt_tokens == 0);
  CHECK(row.completion_tokens == 6);
}

TEST_CASE("G12 through the gateway: no engine usage, include_usage not asked → no usage chunk") {
  Rig rig;
  rig.engine.push(fixture_stream("g12_no_usage.sse"));
  json body = json::parse(test::read_gateway_fixture("g12_request.json"));
  body.erase("stream_options");
  auto r = stream(rig, body.dump());
  CHECK(r.status == 200);
  CHECK(r.done());
  CHECK(count_usage_events(r) == 0);
}

TEST_CASE("G12 through the gateway: engine usage present → the engine's numbers, no flag") {
  Rig rig;
  rig.engine.push(test::sse_script({role_ev(), content_ev("Hi"), finish_ev(), usage_ev(), "[DONE]"}, 5));
  auto r = stream(rig, chat("glm53-flash", true, R"(,"stream_options":{"include_usage":true})"));
  CHECK(count_usage_events(r) == 1);
  auto u = r.event(r.data.size() - 2);
  CHECK(u["usage"] == json::parse(usage_ev())["usage"]);
  REQUIRE(wait_for([&] { return rig.store.count_requests("/v1/chat/completions") == 1; }));
  CHECK(rig.store.recent_requests(1)[0].prompt_tokens == 3);
}

TEST_CASE("G12 through the gateway: llama-server timings, no usage → measured completion count") {
  Rig rig;
  rig.engine.push(fixture_stream("g12_llama_timings.sse"));
  auto r = stream(rig, chat("glm53-flash", true, R"(,"stream_options":{"include_usage":true})"));
  CHECK(r.done());
  REQUIRE(count_usage_events(r) == 1);
  auto u = r.event(r.data.size() - 2)["usage"];
  CHECK(u["completion_tokens"] == 5);
  CHECK(u["servedeck_usage_source"]["completion_tokens"] == "engine_timings");
  CHECK(u["servedeck_usage_source"]["prompt_tokens"] == "request_estimate");
}

TEST_CASE("G12 non-streamed through the gateway: a body without usage gets a flagged estimate") {
  Rig rig;
  rig.engine.push(test::json_script(200, test::read_gateway_fixture("g12_no_usage.json")));
  auto r = rig.post("/v1/chat/completions", chat("glm53-flash", false));
  CHECK(r.status == 200);
  auto b = json::parse(r.body);
  REQUIRE(b.contains("usage"));
  CHECK(b["usage"]["completion_tokens"] == 13);
  CHECK(b["usage"]["prompt_tokens"] == gateway::estimate_request_tokens(rig.engine.last_body()));
  CHECK(b["usage"]["servedeck_estimated"] == true);
  REQUIRE(wait_for([&] { return rig.store.count_requests("/v1/chat/completions") == 1; }));
  auto row = rig.store.recent_requests(1)[0];
  CHECK(row.prompt_tokens == 0);       // not the estimate: the engine reported nothing
  CHECK(row.completion_tokens == 0);
}

TEST_CASE("G12: the openai SDK (node_modules, v6) reads the synthesised usage and its flag") {
  Rig rig;
  // Two streamed requests, then one plain one (the last script repeats).
  rig.engine.push(fixture_stream("g12_no_usage.sse"));
  rig.engine.push(fixture_stream("g12_no_usage.sse"));
  rig.engine.push(test::json_script(200, test::read_gateway_fixture("g12_no_usage.json")));
  const std::string src = SERVEDECK_SOURCE_DIR;
  const std::string cmd = "node '" + src + "/tests/gateway/server/openai_usage_client.mjs' 'http://127.0.0.1:" +
                          std::to_string(rig.gw.port()) + "/v1' '" + src +
                          "/tests/gateway/server/fixtures/g12_request.json' 2>&1";
  const sdtest::Run run = sdtest::cli_cmd(cmd);
  const std::string& out = run.out;
  REQUIRE_MESSAGE(run.rc == 0, "node failed: " << out);
  std::vector<json> lines;
  std::istringstream in(out);
  for (std::string l; std::getline(in, l);)
    if (!l.empty()) lines.push_back(json::parse(l));
  REQUIRE(lines.size() == 3);
  for (std::size_t i = 0; i < 2; ++i) {
    CAPTURE(lines[i].dump());
    CHECK(lines[i]["content"] == "I will read it.");
    CHECK(lines[i]["usage"]["completion_tokens"] == 6);
    CHECK(lines[i]["usage"]["prompt_tokens"].get<int64_t>() > 0);
    CHECK(lines[i]["usage"]["servedeck_estimated"] == true);
  }
  CHECK(lines[0]["usage_chunks"] == 1);
  CHECK(lines[2]["content"] == "It declares split() and join().");
  CHECK(lines[2]["usage"]["completion_tokens"] == 13);
  CHECK(lines[2]["usage"]["servedeck_estimated"] == true);
}
