#include <doctest/doctest.h>

#include <cmath>
#include <memory>

#include "common/http/server.hpp"
#include "gateway/tools/amnesia_probe.hpp"
#include "gateway/tools/compare.hpp"

using namespace servedeck;
using nlohmann::json;

TEST_CASE("partition_kl: zero for identical distributions, positive and exact on a known pair") {
  tools::PositionLogprobs p = {{"1", std::log(0.5)}, {"2", std::log(0.3)}};
  CHECK(tools::partition_kl(p, p) == doctest::Approx(0.0));
  tools::PositionLogprobs q = {{"1", std::log(0.25)}, {"2", std::log(0.5)}};
  // Partition {1, 2, rest}: p = (.5, .3, .2), q = (.25, .5, .25).
  double expected = 0.5 * std::log(0.5 / 0.25) + 0.3 * std::log(0.3 / 0.5) + 0.2 * std::log(0.2 / 0.25);
  CHECK(tools::partition_kl(p, q) == doctest::Approx(expected).epsilon(1e-9));
}

TEST_CASE("accumulate skips the first (null) position and counts top-1 agreement") {
  json base = json::array({nullptr, {{"5", {{"logprob", -0.1}}}, {"6", {{"logprob", -2.5}}}},
                           {{"7", {{"logprob", -0.2}}}, {"8", {{"logprob", -1.9}}}}});
  json other = json::array({nullptr, {{"5", {{"logprob", -0.1}}}, {"6", {{"logprob", -2.5}}}},
                            {{"7", {{"logprob", -1.9}}}, {"8", {{"logprob", -0.2}}}}});
  tools::CompareStats s;
  tools::accumulate(base, other, s);
  CHECK(s.positions == 2);
  CHECK(s.top1_agreement == doctest::Approx(0.5));
  CHECK(s.max_kl > 0.5);
}

// A fake engine whose next-token distribution depends on whether the rendered prompt carried
// the reasoning: with it, " wants" dominates; without it, greeting-like continuations get mass.
TEST_CASE("probe amnesia reports greeting mass for both arms from the engine's top logprobs") {
  http::ServerOptions opt;
  opt.port = 0;
  http::Server server(opt, [](http::Request req, std::shared_ptr<http::Responder> res) {
    json body = json::parse(req.body);
    if (req.path == "/tokenize") {
      if (body.contains("prompt")) {
        res->send(200, "application/json", json{{"tokens", {900, 901}}}.dump());
        return;
      }
      bool has_reasoning = body["messages"].dump().find("reasoning_content") != std::string::npos;
      json tokens = has_reasoning ? json::array({1, 2, 3, 4, 5}) : json::array({1, 2, 3});
      res->send(200, "application/json", json{{"tokens", tokens}}.dump());
      return;
    }
    bool restored = body["prompt"].size() == 7;  // 5 + 2 continuation tokens
    json top = restored ? json{{" wants", std::log(0.99)}, {" has", std::log(0.001)}}
                        : json{{" wants", std::log(0.5)}, {" has", std::log(0.03)}, {" just", std::log(0.0032)}};
    res->send(200, "application/json",
              json{{"choices", json::array({{{"text", " wants"}, {"logprobs", {{"top_logprobs", json::array({top})}}}}})}}.dump());
  });
  server.start();

  tools::AmnesiaOptions o;
  o.port = server.port();
  o.model = "tiny";
  o.messages = tools::default_amnesia_conversation();
  auto r = tools::run_amnesia_probe(o);
  CHECK(r.dropped.prompt_tokens == 5);
  CHECK(r.restored.prompt_tokens == 7);
  CHECK(r.dropped.amnesia_mass == doctest::Approx(0.0332).epsilon(1e-6));
  CHECK(r.restored.amnesia_mass == doctest::Approx(0.001).epsilon(1e-6));
  CHECK(r.dropped.top.front().first == " wants");
  CHECK(r.table().find("3.32%") != std::string::npos);
}

TEST_CASE("drop_reasoning removes both reasoning dialects from assistant turns only") {
  json m = json::array({{{"role", "user"}, {"content", "x"}, {"reasoning", "keep"}},
                        {{"role", "assistant"}, {"content", ""}, {"reasoning_content", "a"}, {"reasoning", "b"}}});
  json out = tools::drop_reasoning(m);
  CHECK(out[0].contains("reasoning"));
  CHECK_FALSE(out[1].contains("reasoning_content"));
  CHECK_FALSE(out[1].contains("reasoning"));
}
