// The server tests' fixture: a WorkerServer over the fake model (fake_model.hpp) on port 0,
// with plain and streamed POSTs, plus the chat body and tools the tests share.
#pragma once

#include <doctest/doctest.h>

#include <chrono>
#include <thread>

#include "common/http/client.hpp"
#include "common/sse.hpp"
#include "tests/worker/server/fake_model.hpp"
#include "tests/worker/server/raw_client.hpp"

namespace servedeck::worker::testing {

using nlohmann::json;

struct Fixture {
  explicit Fixture(std::size_t kv_bytes = 1 << 20, ToolParserKind parser = ToolParserKind::hermes, int delay_ms = 0,
                   std::shared_future<void> gate = {}, std::size_t prefill_chunk = EngineOptions{}.prefill_chunk) {
    WorkerServerOptions o;
    o.port = 0;
    o.served_model_name = "tiny";
    o.tool_parser = parser;
    server = std::make_unique<WorkerServer>(o, fake_loader(kv_bytes, &handles, gate, delay_ms, prefill_chunk));
    server->start();
    if (!gate.valid()) REQUIRE(server->wait_loaded(std::chrono::seconds(10)) == LoadState::ready);
  }
  http::ClientResponse post(const std::string& path, const std::string& body) const {
    http::ClientRequest r;
    r.port = server->port();
    r.method = "POST";
    r.target = path;
    r.body = body;
    return http::fetch(r);
  }
  http::ClientResponse get(const std::string& path) const {
    http::ClientRequest r;
    r.port = server->port();
    r.target = path;
    return http::fetch(r);
  }
  // Streams a POST; returns the SSE events' data in order. Stops after `max_events` when > 0.
  std::vector<std::string> stream(const std::string& path, const std::string& body, int* status, std::size_t max_events = 0) const {
    std::vector<std::string> events;
    sse::Parser parser;
    *status = raw_post_stream(server->port(), path, body, [&](std::string_view chunk) {
      for (auto& e : parser.feed(chunk)) {
        if (!e.comment) events.push_back(e.data);
      }
      return max_events == 0 || events.size() < max_events;
    });
    return events;
  }
  FakeModelHandles handles;
  std::unique_ptr<WorkerServer> server;
};

inline json chat_body(const std::string& user, bool stream, json extra = json::object()) {
  json b = {{"model", "tiny"}, {"messages", json::array({{{"role", "user"}, {"content", user}}})}, {"stream", stream},
            {"temperature", 0}};
  for (auto& [k, v] : extra.items()) b[k] = v;
  return b;
}

inline const json k_weather_tools = json::parse(R"([{"type":"function","function":{"name":"get_weather",
  "parameters":{"type":"object","properties":{"city":{"type":"string"},"days":{"type":"integer"}}}}}])");

template <class Pred>
bool poll(Pred pred, std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return pred();
}

}  // namespace servedeck::worker::testing
