// gateway/server/stream_normalizer, G12's last clause: the usage chunk synthesised when the
// engine reports none (fixtures: tests/gateway/server/fixtures/g12_*).
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/sse.hpp"
#include "gateway/server/stream_normalizer.hpp"
#include "tests/gateway/server/fixture_files.hpp"

using nlohmann::json;
using servedeck::gateway::StreamEnd;
using servedeck::gateway::StreamNormalizer;
using servedeck::test::gateway_fixture_events;
using servedeck::test::read_gateway_fixture;

namespace {

struct Out {
  std::vector<std::string> data;  // data payloads, "[DONE]" included
  StreamEnd end = StreamEnd::none;
  std::vector<json> usage_events() const {
    std::vector<json> out;
    for (const auto& d : data)
      if (d != "[DONE]" && json::parse(d).contains("usage")) out.push_back(json::parse(d));
    return out;
  }
};

/// Feeds the fixture's events (up to [DONE]) to a normaliser, then finish().
Out replay(const std::string& fixture, bool include_usage, int64_t prompt_estimate) {
  StreamNormalizer::Options o;
  o.model_id = "glm53-flash-low";
  o.include_usage = include_usage;
  o.id_seed = "seed";
  o.prompt_tokens_estimate = prompt_estimate;
  StreamNormalizer n(o);
  std::string wire;
  for (const auto& d : gateway_fixture_events(fixture)) {
    if (d == "[DONE]") break;
    n.on_chunk(json::parse(d), wire);
  }
  Out r;
  r.end = n.finish(wire);
  CHECK(n.usage_synthesized() == (include_usage && !n.usage().has_value()));
  CHECK_FALSE(n.usage().has_value());  // these fixtures carry no engine usage
  servedeck::sse::Parser p;
  for (auto& e : p.feed(wire)) r.data.push_back(e.data);
  return r;
}

}  // namespace

TEST_CASE("G12: no engine usage, client asked: exactly one flagged usage chunk before [DONE]") {
  const int64_t prompt = servedeck::gateway::estimate_request_tokens(json::parse(read_gateway_fixture("g12_request.json")));
  auto r = replay("g12_no_usage.sse", true, prompt);
  CHECK(r.end == StreamEnd::done);
  REQUIRE(r.data.size() >= 3);
  CHECK(r.data.back() == "[DONE]");
  auto usage_events = r.usage_events();
  REQUIRE(usage_events.size() == 1);
  // The usage chunk is the one right before [DONE], after the finish chunk, in the same envelope.
  auto u = json::parse(r.data[r.data.size() - 2]);
  CHECK(u == usage_events[0]);
  CHECK(u["choices"] == json::array());
  CHECK(u["id"] == "chatcmpl-g12a");
  CHECK(u["object"] == "chat.completion.chunk");
  CHECK(u["model"] == "glm53-flash-low");
  CHECK(json::parse(r.data[r.data.size() - 3])["choices"][0]["finish_reason"] == "stop");
  // 2 reasoning chunks + 4 content chunks streamed; the role chunk and the finish chunk carry none.
  CHECK(u["usage"]["completion_tokens"] == 6);
  CHECK(u["usage"]["prompt_tokens"] == prompt);
  CHECK(u["usage"]["total_tokens"] == prompt + 6);
  CHECK(u["usage"]["servedeck_estimated"] == true);
  CHECK(u["usage"]["servedeck_usage_source"] ==
        json{{"prompt_tokens", "request_estimate"}, {"completion_tokens", "output_chunks"}});
}

TEST_CASE("G12: no engine usage, client did not ask: no usage chunk") {
  auto r = replay("g12_no_usage.sse", false, 100);
  CHECK(r.end == StreamEnd::done);
  CHECK(r.usage_events().empty());
  CHECK(r.data.back() == "[DONE]");
}

TEST_CASE("G12: engine usage present: passed unchanged, no servedeck keys") {
  const json engine_usage = {{"prompt_tokens", 5}, {"completion_tokens", 2}, {"total_tokens", 7}};
  StreamNormalizer::Options o;
  o.model_id = "m";
  o.include_usage = true;
  o.prompt_tokens_estimate = 999;
  StreamNormalizer n(o);
  std::string wire;
  n.on_chunk(json::parse(R"({"id":"c1","choices":[{"index":0,"delta":{"content":"a"}}]})"), wire);
  n.on_chunk(json::parse(R"({"id":"c1","choices":[{"index":0,"delta":{"content":"b"}}]})"), wire);
  n.on_chunk(json{{"id", "c1"}, {"choices", json::array()}, {"usage", engine_usage}}, wire);
  n.finish(wire);
  CHECK_FALSE(n.usage_synthesized());
  servedeck::sse::Parser p;
  auto ev = p.feed(wire);
  REQUIRE(ev.size() == 5);
  CHECK(json::parse(ev[3].data)["usage"] == engine_usage);  // exactly the engine's object
  CHECK(ev[4].data == "[DONE]");
}

TEST_CASE("G12: llama-server timings without usage: measured completion, estimated prompt") {
  auto r = replay("g12_llama_timings.sse", true, 150);
  auto usage_events = r.usage_events();
  REQUIRE(usage_events.size() == 1);
  const json& u = usage_events[0]["usage"];
  // 3 content chunks streamed, but the engine measured 5 generated tokens (timings.predicted_n).
  CHECK(u["completion_tokens"] == 5);
  // prompt_n (181) without cache_n counts only the tokens evaluated this time: not used.
  CHECK(u["prompt_tokens"] == 150);
  CHECK(u["total_tokens"] == 155);
  CHECK(u["servedeck_estimated"] == true);
  CHECK(u["servedeck_usage_source"] ==
        json{{"prompt_tokens", "request_estimate"}, {"completion_tokens", "engine_timings"}});
  CHECK(usage_events[0]["system_fingerprint"] == "b4100-1b2c3d4e");
  CHECK_FALSE(usage_events[0].contains("timings"));
}

TEST_CASE("G12 non-streamed: a body without usage gets a flagged estimate; one with usage is untouched") {
  json body = json::parse(read_gateway_fixture("g12_no_usage.json"));
  REQUIRE(StreamNormalizer::normalize_body(body, "glm53-flash", "seed"));
  CHECK(StreamNormalizer::add_missing_usage(body, 40));
  // "It declares split() and join()." (31 bytes) + "Read util.hpp first." (20) = 51 → 13.
  CHECK(body["usage"]["completion_tokens"] == 13);
  CHECK(body["usage"]["prompt_tokens"] == 40);
  CHECK(body["usage"]["total_tokens"] == 53);
  CHECK(body["usage"]["servedeck_estimated"] == true);
  CHECK(body["usage"]["servedeck_usage_source"] ==
        json{{"prompt_tokens", "request_estimate"}, {"completion_tokens", "output_bytes_estimate"}});

  json with = json::parse(R"({"choices":[{"index":0,"message":{"role":"assistant","content":"hi"}}],"usage":{"prompt_tokens":4,"completion_tokens":1,"total_tokens":5}})");
  const json before = with;
  CHECK_FALSE(StreamNormalizer::add_missing_usage(with, 40));
  CHECK(with == before);

  json text = json::parse(R"({"object":"text_completion","choices":[{"index":0,"text":"abcdefgh"}],"timings":{"predicted_n":3}})");
  CHECK(StreamNormalizer::add_missing_usage(text, 2));
  CHECK(text["usage"]["completion_tokens"] == 3);
  CHECK(text["usage"]["servedeck_usage_source"]["completion_tokens"] == "engine_timings");
}
