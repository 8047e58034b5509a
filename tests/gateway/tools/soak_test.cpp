// servedeck soak against an in-process engine-like server that serves a few good turns, then
// "dies" in different ways. Nothing after the death may be counted ok.
#include <doctest/doctest.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <vector>
#include <string>

#include "common/http/server.hpp"
#include "common/sse.hpp"
#include "gateway/tools/soak.hpp"

using namespace servedeck;
using nlohmann::json;

namespace {

enum class Death { cut_mid_stream, empty_200, connection_refused_500 };

struct FakeEngine {
  FakeEngine(int good_turns, Death death) : good_turns_(good_turns), death_(death) {
    http::ServerOptions opt;
    opt.port = 0;
    server_ = std::make_unique<http::Server>(opt, [this](http::Request req, std::shared_ptr<http::Responder> res) {
      int n = ++requests_;
      json body = json::parse(req.body, nullptr, false);
      last_messages_ = body.is_object() && body.contains("messages") ? body["messages"].size() : 0;
      if (body.is_object() && body.contains("messages") && !body["messages"].empty()) {
        std::lock_guard lock(m_);
        system_prompts_.push_back(body["messages"][0].value("content", std::string()));
      }
      last_tools_ = body.is_object() && body.contains("tools") ? body["tools"].size() : 0;
      if (n > good_turns_ && death_ == Death::connection_refused_500) {
        http::send_error(*res, 500, "engine dead", "server_error", "engine_dead", true);
        return;
      }
      res->start_stream(200);
      auto chunk = [](json delta, json finish) {
        return sse::format_data(json{{"object", "chat.completion.chunk"},
                                     {"choices", json::array({{{"index", 0}, {"delta", delta}, {"finish_reason", finish}}})}}
                                    .dump());
      };
      if (n > good_turns_ && death_ == Death::empty_200) {
        res->write(chunk({{"role", "assistant"}}, "stop"));
        res->write(sse::k_done);
        res->end();
        return;
      }
      res->write(chunk({{"role", "assistant"}, {"content", "Looking"}}, nullptr));
      if (n > good_turns_ && death_ == Death::cut_mid_stream) {
        res->end();  // closes without a finish chunk or [DONE]
        return;
      }
      if (n % 2 == 0) {
        res->write(chunk({{"tool_calls", json::array({{{"index", 0}, {"id", "call_" + std::to_string(n)}, {"type", "function"},
                                                        {"function", {{"name", "read_file"}, {"arguments", "{\"path\":\"a\"}"}}}}})}},
                         nullptr));
        res->write(chunk(json::object(), "tool_calls"));
      } else {
        res->write(chunk({{"content", " at it."}}, nullptr));
        res->write(chunk(json::object(), "stop"));
      }
      if (n >= 3) {  // from turn 3 on, usage as the worker reports it (cached tokens growing)
        res->write(sse::format_data(json{{"object", "chat.completion.chunk"}, {"choices", json::array()},
                                         {"usage", {{"prompt_tokens", 1000 * n}, {"completion_tokens", 2},
                                                    {"prompt_tokens_details", {{"cached_tokens", 900 * n}}}}}}
                                        .dump()));
      }
      res->write(sse::k_done);
      res->end();
    });
    server_->start();
  }
  int port() const { return server_->port(); }

  int good_turns_;
  Death death_;
  std::atomic<int> requests_{0};
  std::atomic<std::size_t> last_messages_{0};
  std::atomic<std::size_t> last_tools_{0};
  std::mutex m_;
  std::vector<std::string> system_prompts_;  // messages[0].content of each request
  std::unique_ptr<http::Server> server_;
};

tools::SoakOptions options(int port, int turns) {
  tools::SoakOptions o;
  o.port = port;
  o.model = "tiny";
  o.turns = turns;
  o.gap_timeout_ms = 5000;
  o.time_limit_s = 60;
  return o;
}

}  // namespace

TEST_CASE("soak completes every turn against a healthy engine and regrows the conversation") {
  FakeEngine engine(100, Death::cut_mid_stream);
  auto report = tools::run_soak(options(engine.port(), 6), nullptr);
  CHECK(report.ok_turns == 6);
  CHECK_FALSE(report.failed_turn.has_value());
  CHECK(engine.last_tools_ == 50);
  // 2 initial messages, +2 per turn (assistant + tool result or user nudge), 5 turns before the 6th.
  CHECK(engine.last_messages_ == 2 + 2 * 5);
  CHECK(report.table().find("6 ok") != std::string::npos);
  // The engine's prompt and cached tokens per turn, "-" (null) where it reported none.
  REQUIRE(report.turns.size() == 6);
  CHECK_FALSE(report.turns[1].cached_tokens.has_value());
  CHECK(report.turns[2].prompt_tokens == 3000);
  CHECK(report.turns[5].cached_tokens == 5400);
  const std::string table = report.table();
  CHECK(table.find("prompt_tokens  cached_tokens") != std::string::npos);
  CHECK(table.find("           6000           5400") != std::string::npos);
  CHECK(report.to_json()["turns"][0]["cached_tokens"].is_null());
  CHECK(report.to_json()["turns"][3]["cached_tokens"] == 3600);
}

TEST_CASE("soak --cold-prefix starts every turn's system prompt differently; the default keeps it") {
  FakeEngine engine(100, Death::cut_mid_stream);
  auto o = options(engine.port(), 3);
  REQUIRE(tools::run_soak(o, nullptr).ok_turns == 3);
  o.cold_prefix = true;
  REQUIRE(tools::run_soak(o, nullptr).ok_turns == 3);
  std::lock_guard lock(engine.m_);
  REQUIRE(engine.system_prompts_.size() == 6);
  CHECK(engine.system_prompts_[0] == engine.system_prompts_[2]);
  CHECK(engine.system_prompts_[3].rfind("[turn 1] ", 0) == 0);
  CHECK(engine.system_prompts_[5].rfind("[turn 3] ", 0) == 0);
  CHECK(engine.system_prompts_[5].substr(9) == engine.system_prompts_[0]);
}

TEST_CASE("soak stops at an engine killed mid-stream and names the turn") {
  FakeEngine engine(4, Death::cut_mid_stream);
  auto report = tools::run_soak(options(engine.port(), 10), nullptr);
  CHECK(report.ok_turns == 4);
  REQUIRE(report.failed_turn.has_value());
  CHECK(*report.failed_turn == 5);
  CHECK(report.turns.size() == 5);  // nothing after the death is attempted or counted
  CHECK(report.turns.back().failure == "stream cut before its finish chunk");
  CHECK(engine.requests_ == 5);
}

TEST_CASE("soak counts an HTTP 200 with an empty stream as a failure") {
  FakeEngine engine(2, Death::empty_200);
  auto report = tools::run_soak(options(engine.port(), 10), nullptr);
  CHECK(report.ok_turns == 2);
  REQUIRE(report.failed_turn.has_value());
  CHECK(*report.failed_turn == 3);
  CHECK(report.turns.back().status == 200);
  CHECK(report.turns.back().failure.find("empty stream") != std::string::npos);
}

TEST_CASE("soak reports an engine answering 500 with the status") {
  FakeEngine engine(1, Death::connection_refused_500);
  auto report = tools::run_soak(options(engine.port(), 10), nullptr);
  CHECK(report.ok_turns == 1);
  REQUIRE(report.failed_turn.has_value());
  CHECK(*report.failed_turn == 2);
  CHECK(report.turns.back().status == 500);
  CHECK(report.turns.back().failure.find("HTTP 500") == 0);
}
