// The prefix cache over real HTTP on port 0 with the fake model: usage.prompt_tokens_details.
// cached_tokens (streamed and not) and the /metrics hit and miss counters, a conversation's
// next turn reusing the previous one, and a client that disconnects during a long prefill
// stopping it between chunks.
#include <doctest/doctest.h>

#include <chrono>
#include <thread>
#include <utility>

#include <boost/asio.hpp>

#include "tests/worker/server/server_fixture.hpp"

using namespace servedeck;
using namespace servedeck::worker;
using namespace servedeck::worker::testing;
using nlohmann::json;

namespace {

// The number after `name ` on its own line of a Prometheus text, or -1.
long long metric(const std::string& text, const std::string& name) {
  const auto at = text.find("\n" + name + " ");
  if (at == std::string::npos) return -1;
  return std::stoll(text.substr(at + name.size() + 2));
}

json usage_of_stream(const std::vector<std::string>& events) {
  for (const auto& e : events)
    if (e != "[DONE]" && json::parse(e).contains("usage")) return json::parse(e)["usage"];
  return nullptr;
}

}  // namespace

TEST_CASE("usage reports the prompt tokens reused from the prefix cache; /metrics counts hits and misses") {
  Fixture f;
  const std::string body = chat_body("hi there, a question about caches", false).dump();
  const auto first = json::parse(f.post("/v1/chat/completions", body).body);
  REQUIRE(first.contains("usage"));
  const int prompt = first["usage"]["prompt_tokens"];
  const int completion = first["usage"]["completion_tokens"];
  CHECK(first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0);
  const auto second = json::parse(f.post("/v1/chat/completions", body).body);
  // The first request stored its prompt and all but its last token; whole blocks of 16 come
  // back, at most prompt - 1 tokens.
  const int cached = std::min(prompt + completion - 1, prompt - 1) / 16 * 16;
  CHECK(cached > 0);
  CHECK(second["usage"]["prompt_tokens_details"]["cached_tokens"] == cached);
  CHECK(second["usage"]["prompt_tokens"] == prompt);
  CHECK(second["choices"][0]["message"]["content"] == first["choices"][0]["message"]["content"]);

  int status = 0;
  const auto events = f.stream("/v1/chat/completions",
                               chat_body("hi there, a question about caches", true, {{"stream_options", {{"include_usage", true}}}}).dump(),
                               &status);
  CHECK(status == 200);
  const json usage = usage_of_stream(events);
  REQUIRE(usage.is_object());
  CHECK(usage["prompt_tokens_details"]["cached_tokens"] == cached);

  const std::string m = f.get("/metrics").body;
  CHECK(metric(m, "servedeck_worker_prefix_cache_hit_tokens_total") == 2 * cached);
  CHECK(metric(m, "servedeck_worker_prefix_cache_miss_tokens_total") == 3 * prompt - 2 * cached);
  CHECK(metric(m, "servedeck_worker_prompt_tokens_total") == 3 * prompt);
  CHECK(m.find("servedeck_worker_kv_blocks{state=\"held\"} 0") != std::string::npos);
  CHECK(metric(m, "servedeck_worker_kv_block_tokens") == 16);
  CHECK(metric(m, "servedeck_worker_kv_block_evictions_total") == 0);
}

TEST_CASE("a conversation's next turn reuses the previous turn's prompt and answer") {
  Fixture f;
  json messages = json::array({{{"role", "user"}, {"content", "Tell me about KV caches, please, at some length."}}});
  json body = {{"model", "tiny"}, {"messages", messages}, {"temperature", 0}};
  const auto t1 = json::parse(f.post("/v1/chat/completions", body.dump()).body);
  const std::string answer = t1["choices"][0]["message"]["content"];
  const int p1 = t1["usage"]["prompt_tokens"];
  messages.push_back({{"role", "assistant"}, {"content", answer}});
  messages.push_back({{"role", "user"}, {"content", "And the prefix cache?"}});
  body["messages"] = messages;
  const auto t2 = json::parse(f.post("/v1/chat/completions", body.dump()).body);
  const int cached = t2["usage"]["prompt_tokens_details"]["cached_tokens"];
  // The template renders turn 1 the same way, so at least its prompt's full blocks come back
  // (the answer re-encoded from its text may split into other tokens than were sampled).
  CHECK(cached >= p1 / 16 * 16);
  CHECK(cached > 0);
  CHECK(cached % 16 == 0);
  CHECK(cached < t2["usage"]["prompt_tokens"].get<int>());
}

TEST_CASE("a client that disconnects during a long prefill stops it between chunks") {
  Fixture f(1 << 22, ToolParserKind::hermes, /*delay_ms=*/25, {}, /*prefill_chunk=*/64);
  const std::string user(64 * 40, 'x');  // ~40 chunks of 64 byte tokens, 25 ms each
  const std::string body = chat_body(user, true).dump();
  namespace asio = boost::asio;
  asio::io_context io;
  asio::ip::tcp::socket sock(io);
  sock.connect({asio::ip::make_address("127.0.0.1"), static_cast<unsigned short>(f.server->port())});
  const std::string req = "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                          "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
  asio::write(sock, asio::buffer(req));
  REQUIRE(poll([&] { return f.handles.backend->forward_calls.load() >= 2; }));
  sock.close();  // gone before the first token: nothing was sent yet
  REQUIRE(poll([&] {
    const auto s = f.handles.engine->stats();
    return !s.running && s.requests_finished == 1;
  }));
  const auto ran = f.handles.backend->forward_calls.load();
  CHECK(ran < 40);
  std::this_thread::sleep_for(std::chrono::milliseconds(80));
  CHECK(f.handles.backend->forward_calls.load() == ran);  // nothing more ran
  CHECK(f.handles.engine->stats().kv_blocks.held == 0);
  CHECK(f.get("/metrics").body.find("route=\"chat\",status=\"499\"") != std::string::npos);
  for (const auto& p : f.handles.backend->passes()) CHECK(p.second == 64);  // prefill chunks only, no decode
}

TEST_CASE("a request longer than the whole pool is a 400 naming both numbers, and the worker goes on") {
  Fixture f(16 * 8 * 256);  // 8 blocks of 16 tokens
  const std::string long_user(200, 'y');
  auto r = f.post("/v1/chat/completions", chat_body(long_user, false, {{"max_tokens", 4}}).dump());
  CHECK(r.status == 400);
  const auto err = json::parse(r.body)["error"];
  CHECK(err["code"] == "context_length_exceeded");
  const std::string msg = err["message"];
  CHECK(msg.find("exceeds the KV cache capacity of 128 tokens (--kv-cache-bytes 32768 / 256 bytes per token, in blocks of 16 tokens)") !=
        std::string::npos);
  CHECK(f.post("/v1/chat/completions", chat_body("hi", false, {{"max_tokens", 4}}).dump()).status == 200);
}
