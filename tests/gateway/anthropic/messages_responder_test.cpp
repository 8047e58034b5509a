#include <doctest/doctest.h>

#include <memory>
#include <string>
#include <vector>

#include "common/sse.hpp"
#include "gateway/anthropic/messages_responder.hpp"

using namespace servedeck;
using namespace servedeck::gateway::anthropic;
using nlohmann::json;

namespace {

/// Records what would reach the client.
struct RecordingResponder : http::Responder {
  int status = 0;
  std::string body;
  std::string stream;
  http::Headers headers;
  bool ended = false;
  void send(int s, std::string, std::string b, http::Headers h) override {
    status = s;
    body = std::move(b);
    headers = std::move(h);
  }
  bool start_stream(int s, std::string, http::Headers h) override {
    status = s;
    headers = std::move(h);
    return true;
  }
  bool write(std::string_view bytes) override {
    stream.append(bytes);
    return true;
  }
  void end() override { ended = true; }
  bool client_gone() const override { return false; }
  void on_disconnect(std::function<void()>) override {}

  std::vector<sse::Event> events() const {
    sse::Parser p(128u * 1024 * 1024);  // room for the oversized events some cases send
    return p.feed(stream);
  }
  std::string types() const {
    std::string out;
    for (const auto& e : events()) out += (out.empty() ? "" : ",") + (e.comment ? ":" + e.data : e.event);
    return out;
  }
  std::string header(const std::string& name) const {
    for (const auto& [k, v] : headers)
      if (k == name) return v;
    return "";
  }
};

std::string chunk(json delta, json finish = nullptr) {
  return sse::format_data(json{{"choices", json::array({{{"index", 0}, {"delta", delta}, {"finish_reason", finish}}})}}.dump());
}

}  // namespace

TEST_CASE("a proxied chat stream becomes a Messages stream; heartbeat comments become pings") {
  auto client = std::make_shared<RecordingResponder>();
  auto req = std::make_shared<TranslatedRequest>();
  MessagesResponder r(client, req, "tiny-chat");
  REQUIRE(r.start_stream(200));
  CHECK(r.write(sse::format_comment("waiting for the engine's first token")));
  // Split inside an event: the adapter reassembles SSE across writes.
  const std::string first = chunk({{"role", "assistant"}, {"content", "Hel"}});
  CHECK(r.write(first.substr(0, 11)));
  CHECK(r.write(first.substr(11) + chunk({{"content", "lo"}}) + chunk(json::object(), "stop")));
  CHECK(r.write(sse::format_data(R"({"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":2}})") + std::string(sse::k_done)));
  r.end();
  CHECK(client->ended);
  CHECK(client->status == 200);
  CHECK(client->header("request-id").rfind("req_", 0) == 0);
  CHECK(client->types() == "message_start,ping,content_block_start,content_block_delta,content_block_delta,"
                           "content_block_stop,message_delta,message_stop");
  auto ev = client->events();
  CHECK(json::parse(ev[0].data)["message"]["model"] == "tiny-chat");
  CHECK(json::parse(ev[6].data)["usage"]["input_tokens"] == 9);
}

TEST_CASE("an engine error mid-stream, or a stream cut before [DONE], ends with an error event and no message_stop") {
  {
    auto client = std::make_shared<RecordingResponder>();
    MessagesResponder r(client, std::make_shared<TranslatedRequest>(), "m");
    r.start_stream(200);
    r.write(chunk({{"content", "partial"}}));
    r.write(sse::format_data(R"({"error":{"message":"engine died","type":"server_error","code":"upstream_closed","source":"engine"}})"));
    r.end();
    CHECK(client->types() == "message_start,content_block_start,content_block_delta,error");
    json err = json::parse(client->events().back().data);
    CHECK(err["error"]["type"] == "api_error");
    CHECK(err["error"]["message"] == "engine died (code upstream_closed, from engine)");
  }
  {
    auto client = std::make_shared<RecordingResponder>();
    MessagesResponder r(client, std::make_shared<TranslatedRequest>(), "m");
    r.start_stream(200);
    r.write(chunk({{"content", "partial"}}));
    r.end();  // no [DONE]
    CHECK(client->types() == "message_start,content_block_start,content_block_delta,error");
    CHECK(client->stream.find("message_stop") == std::string::npos);
  }
}

TEST_CASE("a chat event larger than an engine's event ends the Messages stream with an error, never dropped silently") {
  // A tool call the policies held and sent as one chunk can outgrow any single engine event
  // (16 MiB): it is translated whole; one over 64 MiB fails the stream.
  for (const std::size_t size : {std::size_t{17} << 20, std::size_t{65} << 20}) {
    CAPTURE(size);
    auto client = std::make_shared<RecordingResponder>();
    MessagesResponder r(client, std::make_shared<TranslatedRequest>(), "tiny");
    REQUIRE(r.start_stream(200));
    r.write(chunk({{"role", "assistant"}, {"content", "Hel"}}));
    r.write(chunk({{"tool_calls", json::array({{{"index", 0}, {"id", "call_1"}, {"type", "function"},
                                                {"function", {{"name", "write"}, {"arguments", ""}}}}})}}));
    // The arguments {"content": "xxx…"}, as the event's JSON string.
    r.write("data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":"
            "\"{\\\"content\\\": \\\"" + std::string(size, 'x'));
    r.write("\\\"}\"}}]}}]}\n\n" + chunk(json::object(), "tool_calls") + std::string(sse::k_done));
    r.end();
    const std::string types = client->types();
    CAPTURE(types);
    if (size < (std::size_t{64} << 20)) {
      CHECK(types == "message_start,content_block_start,content_block_delta,content_block_stop,content_block_start,"
                     "content_block_delta,content_block_stop,message_delta,message_stop");
      CHECK(client->stream.size() > size);
    } else {
      CHECK(types == "message_start,content_block_start,content_block_delta,content_block_stop,content_block_start,error");
      CHECK(client->stream.find("more than 64 MiB") != std::string::npos);
    }
  }
}

TEST_CASE("errors before the stream keep their status in Anthropic's envelope; an unknown model is not_found_error") {
  auto client = std::make_shared<RecordingResponder>();
  MessagesResponder r(client, std::make_shared<TranslatedRequest>(), "m");
  r.send(409, "application/json",
         R"({"error":{"message":"model 'tiny' is not running","type":"invalid_request_error","code":"model_not_running","param":null,"source":"servedeck"}})");
  CHECK(client->status == 409);
  CHECK(json::parse(client->body) == json{{"type", "error"}, {"error", {{"type", "invalid_request_error"},
                                          {"message", "model 'tiny' is not running (code model_not_running, from servedeck)"}}}});
  CHECK(json::parse(error_from_openai(404, R"({"error":{"message":"no such model","code":"model_not_found"}})").dump())["error"]["type"] == "not_found_error");
  CHECK(error_from_openai(503, R"({"error":{"message":"loading"}})")["error"]["type"] == "overloaded_error");
  CHECK(error_from_openai(502, "not json")["error"] == json{{"type", "api_error"}, {"message", "not json"}});
}

TEST_CASE("a non-streamed chat completion is answered as a message object") {
  auto client = std::make_shared<RecordingResponder>();
  MessagesResponder r(client, std::make_shared<TranslatedRequest>(), "tiny-chat");
  r.send(200, "application/json",
         R"({"choices":[{"index":0,"finish_reason":"stop","message":{"role":"assistant","content":"Hello."}}],"usage":{"prompt_tokens":5,"completion_tokens":2}})");
  CHECK(client->status == 200);
  json msg = json::parse(client->body);
  CHECK(msg["type"] == "message");
  CHECK(msg["id"].get<std::string>().rfind("msg_", 0) == 0);
  CHECK(msg["content"] == json::array({{{"type", "text"}, {"text", "Hello."}}}));
  CHECK(msg["stop_reason"] == "end_turn");
  CHECK(msg["usage"]["output_tokens"] == 2);
}

TEST_CASE("a non-streamed tool call whose arguments do not parse is answered 502 naming the call") {
  auto client = std::make_shared<RecordingResponder>();
  MessagesResponder r(client, std::make_shared<TranslatedRequest>(), "tiny-chat");
  r.send(200, "application/json",
         R"({"choices":[{"index":0,"finish_reason":"tool_calls","message":{"role":"assistant","content":null,)"
         R"("tool_calls":[{"id":"call_x","type":"function","function":{"name":"Read","arguments":"{\"file_path\": \"/a"}}]}}]})");
  CHECK(client->status == 502);
  json e = json::parse(client->body);
  CHECK(e["type"] == "error");
  CHECK(e["error"]["type"] == "api_error");
  const std::string message = e["error"]["message"];
  CHECK(message.find("tool call 'Read' (call_x)") != std::string::npos);
  CHECK(message.find("{\"file_path\": \"/a") != std::string::npos);
  CHECK_FALSE(client->header("request-id").empty());
}
