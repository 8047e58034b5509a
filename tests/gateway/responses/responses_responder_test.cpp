#include <doctest/doctest.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "common/sse.hpp"
#include "gateway/responses/responses_responder.hpp"

using namespace servedeck;
using namespace servedeck::gateway::responses;
using nlohmann::json;

namespace {

/// Records what would reach the client.
struct RecordingResponder : http::Responder {
  int status = 0;
  std::string body;
  std::string stream;
  bool ended = false;
  void send(int s, std::string, std::string b, http::Headers) override {
    status = s;
    body = std::move(b);
  }
  bool start_stream(int s, std::string, http::Headers) override {
    status = s;
    return true;
  }
  bool write(std::string_view bytes) override {
    stream.append(bytes);
    return true;
  }
  void end() override { ended = true; }
  bool client_gone() const override { return false; }
  void on_disconnect(std::function<void()>) override {}

  std::vector<std::string> event_types() const {
    sse::Parser p;
    std::vector<std::string> out;
    for (const auto& e : p.feed(stream)) out.push_back(e.comment ? ":" + e.data : e.event);
    return out;
  }
};

std::string chunk(json delta, json finish = nullptr) {
  return sse::format_data(json{{"choices", json::array({{{"index", 0}, {"delta", delta}, {"finish_reason", finish}}})}}.dump());
}

std::shared_ptr<TranslatedRequest> request(bool store) {
  auto r = std::make_shared<TranslatedRequest>();
  r->store = store;
  r->chat["messages"] = json::array({{{"role", "user"}, {"content", "hi"}}});
  return r;
}

}  // namespace

TEST_CASE("streamed chat chunks become a complete Responses stream; the turn is stored for previous_response_id") {
  auto client = std::make_shared<RecordingResponder>();
  std::string stored_id;
  json stored;
  ResponsesResponder r(client, request(true), "tiny", [&](const std::string& id, const json& m) {
    stored_id = id;
    stored = m;
  });
  REQUIRE(r.start_stream(200));
  // Bytes split at awkward places, as the proxy may write them.
  std::string wire = ": queued\n\n" + chunk({{"role", "assistant"}}) + chunk({{"content", "Hel"}}) + chunk({{"content", "lo"}}) +
                     chunk(json::object(), "stop") + std::string(sse::k_done);
  for (std::size_t i = 0; i < wire.size(); i += 7) r.write(wire.substr(i, 7));
  r.end();
  const std::vector<std::string> want = {"response.created", "response.in_progress", ":queued",
                                         "response.output_item.added", "response.content_part.added",
                                         "response.output_text.delta", "response.output_text.delta",
                                         "response.output_text.done", "response.content_part.done",
                                         "response.output_item.done", "response.completed"};
  CHECK(client->event_types() == want);
  CHECK(client->ended);
  CHECK(stored_id == r.response_id());
  REQUIRE(stored.size() == 2);
  CHECK(stored[1]["role"] == "assistant");
  CHECK(stored[1]["content"] == "Hello");
}

TEST_CASE("G32: an error event or a cut stream ends with response.failed, and nothing is stored") {
  for (bool cut : {false, true}) {
    auto client = std::make_shared<RecordingResponder>();
    bool stored = false;
    ResponsesResponder r(client, request(true), "tiny", [&](const std::string&, const json&) { stored = true; });
    r.start_stream(200);
    r.write(chunk({{"tool_calls", json::array({{{"index", 0}, {"id", "call_1"}, {"type", "function"},
                                                {"function", {{"name", "read"}, {"arguments", "{"}}}}})}}));
    if (!cut) {
      r.write(sse::format_data(json{{"error", {{"message", "Context size has been exceeded."}, {"code", 500}}}}.dump()));
    }
    r.end();
    auto types = client->event_types();
    REQUIRE_FALSE(types.empty());
    CHECK(types.back() == "response.failed");
    CHECK(std::count(types.begin(), types.end(), "response.failed") == 1);
    CHECK(client->stream.find(cut ? "upstream_closed" : "Context size has been exceeded.") != std::string::npos);
    CHECK_FALSE(stored);
  }
}

TEST_CASE("an answer the engine ended with finish abort is response.failed and is not stored, streamed or not") {
  for (bool streamed : {true, false}) {
    CAPTURE(streamed);
    auto client = std::make_shared<RecordingResponder>();
    bool stored = false;
    ResponsesResponder r(client, request(true), "tiny", [&](const std::string&, const json&) { stored = true; });
    if (streamed) {
      r.start_stream(200);
      r.write(chunk({{"content", "Hel"}}) + chunk(json::object(), "abort") + std::string(sse::k_done));
      r.end();
      auto types = client->event_types();
      REQUIRE_FALSE(types.empty());
      CHECK(types.back() == "response.failed");
    } else {
      r.send(200, "application/json",
             json{{"choices", json::array({{{"index", 0}, {"message", {{"role", "assistant"}, {"content", "Hel"}}},
                                            {"finish_reason", "abort"}}})}}.dump(),
             {});
      CHECK(json::parse(client->body)["status"] == "failed");
    }
    CHECK_FALSE(stored);
  }
}

TEST_CASE("hostile engine events: a non-string error message, an unparseable event cut inside a UTF-8 character") {
  auto client = std::make_shared<RecordingResponder>();
  ResponsesResponder r(client, request(false), "tiny", nullptr);
  r.start_stream(200);
  // json::value("message", ...) threw type_error.302 on a number here
  CHECK_NOTHROW(r.write(sse::format_data(R"({"error":{"message":42,"code":7}})")));
  sse::Parser p;
  auto events = p.feed(client->stream);
  REQUIRE_FALSE(events.empty());
  CHECK(events.back().event == "response.failed");
  json failed = json::parse(events.back().data);
  CHECK(failed["response"]["error"]["code"] == "7");
  CHECK(failed["response"]["error"]["message"] == R"({"code":7,"message":42})");

  // An event that is not JSON is quoted in response.failed (its first 200 bytes): with "é" (C3 A9)
  // at bytes 199-200 the quote ends inside the character; dump() threw type_error.316 on it.
  auto client2 = std::make_shared<RecordingResponder>();
  ResponsesResponder r2(client2, request(false), "tiny", nullptr);
  r2.start_stream(200);
  std::string bad = "{\"content\": \"" + std::string(199 - 13, 'a') + "\xc3\xa9 not closed";
  REQUIRE(bad.substr(199, 2) == "\xc3\xa9");
  CHECK_NOTHROW(r2.write("data: " + bad + "\n\n"));
  auto events2 = p.feed(client2->stream);
  REQUIRE_FALSE(events2.empty());
  CHECK(events2.back().event == "response.failed");
  json failed2 = json::parse(events2.back().data);
  const std::string message = failed2["response"]["error"]["message"].get<std::string>();
  CHECK(message.find("malformed JSON at byte") != std::string::npos);
  CHECK(message.size() >= 3);
  CHECK(message.substr(message.size() - 3) == "\xef\xbf\xbd");  // the cut half became U+FFFD
}

TEST_CASE("non-streaming: a chat.completion becomes a response object; errors pass through") {
  auto client = std::make_shared<RecordingResponder>();
  ResponsesResponder r(client, request(false), "tiny-high", nullptr);
  json completion = {{"object", "chat.completion"},
                     {"choices", json::array({{{"index", 0}, {"finish_reason", "tool_calls"},
                                                {"message", {{"role", "assistant"}, {"content", nullptr},
                                                             {"tool_calls", json::array({{{"id", "c1"}, {"type", "function"},
                                                                                          {"function", {{"name", "ls"}, {"arguments", "{}"}}}}})}}}}})},
                     {"usage", {{"prompt_tokens", 5}, {"completion_tokens", 3}, {"total_tokens", 8}}}};
  r.send(200, "application/json", completion.dump());
  REQUIRE(client->status == 200);
  json resp = json::parse(client->body);
  CHECK(resp["object"] == "response");
  CHECK(resp["model"] == "tiny-high");
  CHECK(resp["status"] == "completed");
  REQUIRE(resp["output"].size() == 1);
  CHECK(resp["output"][0]["type"] == "function_call");
  CHECK(resp["output"][0]["call_id"] == "c1");
  CHECK(resp["usage"]["total_tokens"] == 8);

  auto client2 = std::make_shared<RecordingResponder>();
  ResponsesResponder r2(client2, request(false), "tiny", nullptr);
  r2.send(409, "application/json", R"({"error":{"message":"model 'x' is not running","code":"model_not_running"}})");
  CHECK(client2->status == 409);
  CHECK(client2->body.find("model_not_running") != std::string::npos);
}

TEST_CASE("G12: a usage the gateway synthesised keeps its servedeck marker in response.usage; the engine's usage gets none") {
  // The usage object as the chat path writes it when the engine reported none
  // (gateway/server/usage_estimate.hpp: synthesize_usage), and as an engine reports it.
  const json estimated = {{"prompt_tokens", 21}, {"completion_tokens", 4}, {"total_tokens", 25},
                          {"servedeck_estimated", true},
                          {"servedeck_usage_source", {{"prompt_tokens", "request_estimate"},
                                                      {"completion_tokens", "output_chunks"}}}};
  const json engine = {{"prompt_tokens", 21}, {"completion_tokens", 4}, {"total_tokens", 25}};
  for (bool synthesised : {true, false}) {
    CAPTURE(synthesised);
    const json& usage = synthesised ? estimated : engine;

    // Streamed: the usage chunk after the finish chunk, then [DONE].
    auto client = std::make_shared<RecordingResponder>();
    ResponsesResponder r(client, request(false), "tiny", nullptr);
    REQUIRE(r.start_stream(200));
    r.write(chunk({{"role", "assistant"}}) + chunk({{"content", "Hello"}}) + chunk(json::object(), "stop") +
            sse::format_data(json{{"object", "chat.completion.chunk"}, {"choices", json::array()}, {"usage", usage}}.dump()) +
            std::string(sse::k_done));
    r.end();
    sse::Parser p;
    json completed;
    for (const auto& e : p.feed(client->stream))
      if (e.event == "response.completed") completed = json::parse(e.data);
    REQUIRE(completed.is_object());
    const json& su = completed["response"]["usage"];
    INFO(su.dump());
    CHECK(su["input_tokens"] == 21);
    CHECK(su["output_tokens"] == 4);
    CHECK(su["total_tokens"] == 25);

    // Non-streamed: the chat.completion body with the same usage.
    auto client2 = std::make_shared<RecordingResponder>();
    ResponsesResponder r2(client2, request(false), "tiny", nullptr);
    json completion = {{"object", "chat.completion"},
                       {"choices", json::array({{{"index", 0}, {"finish_reason", "stop"},
                                                  {"message", {{"role", "assistant"}, {"content", "Hello"}}}}})},
                       {"usage", usage}};
    r2.send(200, "application/json", completion.dump());
    REQUIRE(client2->status == 200);
    const json bu = json::parse(client2->body)["usage"];
    INFO(bu.dump());
    CHECK(bu["input_tokens"] == 21);
    CHECK(bu["output_tokens"] == 4);

    for (const json& u : {su, bu}) {
      if (synthesised) {
        CHECK(u["servedeck_estimated"] == true);
        CHECK(u["servedeck_usage_source"]["prompt_tokens"] == "request_estimate");
        CHECK(u["servedeck_usage_source"]["completion_tokens"] == "output_chunks");
      } else {
        CHECK_FALSE(u.contains("servedeck_estimated"));
        CHECK_FALSE(u.contains("servedeck_usage_source"));
      }
    }
  }
}

TEST_CASE("a chat event over 64 MiB ends the Responses stream as failed, never dropped silently") {
  auto client = std::make_shared<RecordingResponder>();
  ResponsesResponder r(client, request(false), "tiny", nullptr);
  REQUIRE(r.start_stream(200));
  r.write(chunk({{"role", "assistant"}}) + chunk({{"content", "Hel"}}));
  r.write("data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"" + std::string(65u * 1024 * 1024, 'x'));
  r.write("\"}}]}\n\n" + chunk(json::object(), "stop") + std::string(sse::k_done));
  r.end();
  auto types = client->event_types();
  REQUIRE_FALSE(types.empty());
  CHECK(types.back() == "response.failed");
  CHECK(client->stream.find("event_too_large") != std::string::npos);
  CHECK(std::count(types.begin(), types.end(), "response.completed") == 0);
}
