// libFuzzer target: the /v1/responses bridge on hostile input.
//   first byte 'q': the rest is a Responses request body → translate_request (with a stored
//     earlier turn as previous_messages when the body names previous_response_id);
//   first byte 's': the rest is the chat-completion SSE stream the bridge translates, written to
//     the ResponsesResponder in pieces of 1, 5 and 128 bytes in turn, then end();
//   anything else: the whole input is a non-streamed chat.completion body → send(200, …).
// Invariants: nothing throws; a translated request is a chat body with a non-empty messages
// array that serialises and parses back; every event the responder writes is `event: <type>`
// with a JSON object whose "type" is that type, in increasing sequence_number, and a stream
// ends with exactly one of response.completed / .incomplete / .failed; a non-streamed answer
// is a JSON object.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "common/json_limits.hpp"
#include "common/sse.hpp"
#include "gateway/responses/request_translator.hpp"
#include "gateway/responses/responses_responder.hpp"

using namespace servedeck;
using namespace servedeck::gateway::responses;
using nlohmann::json;

namespace {

/// What would reach the client.
struct Recorder : http::Responder {
  int status = 0;
  std::string body, stream;
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
  void end() override {}
  bool client_gone() const override { return false; }
  void on_disconnect(std::function<void()>) override {}
};

std::shared_ptr<TranslatedRequest> plain_request() {
  auto r = std::make_shared<TranslatedRequest>();
  const json body = {{"model", "glm53-flash"}, {"input", "hi"}, {"store", true},
                     {"tools", json::array({{{"type", "function"}, {"name", "read"}},
                                            {{"type", "namespace"}, {"name", "mcp_fs"},
                                             {"tools", json::array({{{"name", "list"}}})}}})}};
  if (translate_request(body, nullptr, *r)) __builtin_trap();
  return r;
}

void check_stream(const std::string& wire) {
  sse::Parser p;
  auto events = p.feed(wire);
  if (auto last = p.finish()) events.push_back(*last);
  int64_t seq = -1;
  int terminal = 0;
  for (const auto& e : events) {
    if (e.comment) continue;
    json d = parse_untrusted(e.data);
    if (!d.is_object() || !d.contains("type") || d["type"] != e.event) __builtin_trap();
    if (!d.contains("sequence_number") || !d["sequence_number"].is_number_integer() ||
        d["sequence_number"].get<int64_t>() <= seq)
      __builtin_trap();
    seq = d["sequence_number"].get<int64_t>();
    if (e.event == "response.completed" || e.event == "response.incomplete" || e.event == "response.failed") ++terminal;
  }
  if (terminal != 1) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const char mode = text.empty() ? '\0' : text.front();
  const std::string_view rest = text.empty() ? text : text.substr(1);
  if (mode == 'q') {
    json body = parse_untrusted(rest);
    if (body.is_discarded()) return 0;
    const json previous = json::array({{{"role", "system"}, {"content", "be brief"}},
                                       {{"role", "user"}, {"content", "hi"}},
                                       {{"role", "assistant"}, {"content", "hello"}}});
    TranslatedRequest out;
    auto err = translate_request(body, body.is_object() && body.contains("previous_response_id") ? &previous : nullptr, out);
    if (err) {
      if (err->empty()) __builtin_trap();
      return 0;
    }
    if (!out.chat.is_object() || !out.chat.contains("messages") || !out.chat["messages"].is_array() ||
        out.chat["messages"].empty())
      __builtin_trap();
    if (parse_untrusted(dump_safe(out.chat)).is_discarded()) __builtin_trap();
    return 0;
  }
  auto client = std::make_shared<Recorder>();
  int stored = 0;
  ResponsesResponder r(client, plain_request(), "glm53-flash", [&](const std::string&, const json& m) {
    if (!m.is_array()) __builtin_trap();
    ++stored;
  });
  if (mode == 's') {
    static constexpr std::size_t k_pieces[] = {1, 5, 128};
    r.start_stream(200);
    std::size_t at = 0, i = 0;
    while (at < rest.size()) {
      std::size_t n = k_pieces[i++ % std::size(k_pieces)];
      r.write(rest.substr(at, n));
      at += n;
    }
    r.end();
    check_stream(client->stream);
    if (stored > 1) __builtin_trap();
    return 0;
  }
  r.send(200, "application/json", std::string(text));
  if (!parse_untrusted(client->body).is_object()) __builtin_trap();
  return 0;
}
