#include "gateway/tools/stream_reader.hpp"

#include <chrono>
#include <map>

#include "common/json_limits.hpp"
#include "common/sse.hpp"

namespace servedeck::tools {

using nlohmann::json;
using clock_type = std::chrono::steady_clock;

double StreamedTurn::decode_tok_s() const {
  int64_t tokens = delta_events;
  if (usage.is_object() && usage.contains("completion_tokens") && usage["completion_tokens"].is_number_integer())
    tokens = usage["completion_tokens"].get<int64_t>();
  double secs = (total_ms - ttft_ms) / 1000.0;
  if (tokens <= 1 || secs <= 0) return 0;
  return static_cast<double>(tokens - 1) / secs;
}

StreamedTurn read_chat_stream(const std::string& host, int port, const std::string& path, json body,
                              int timeout_ms, const std::string& api_key) {
  StreamedTurn turn;
  body["stream"] = true;
  if (!body.contains("stream_options")) body["stream_options"] = {{"include_usage", true}};
  http::ClientRequest req;
  req.host = host;
  req.port = port;
  req.method = "POST";
  req.target = path;
  req.body = dump_safe(body);
  req.timeout_ms = timeout_ms;
  if (!api_key.empty()) req.headers.push_back({"Authorization", "Bearer " + api_key});

  const auto start = clock_type::now();
  auto ms_since_start = [&] {
    return std::chrono::duration<double, std::milli>(clock_type::now() - start).count();
  };
  sse::Parser parser;
  bool saw_done = false, saw_error = false, saw_finish = false, first_token = false;
  std::string error_text, error_body;
  std::map<int, json> calls;
  auto take = [&](const sse::Event& ev) {
    if (ev.comment) return;
    if (ev.data == "[DONE]") {
      saw_done = true;
      return;
    }
    JsonError perr;
    json chunk = parse_untrusted(ev.data, &perr);
    if (chunk.is_discarded()) {
      saw_error = true;
      error_text = "unparseable event (" + perr.message + "): " + ev.data.substr(0, 200);
      return;
    }
    if (chunk.is_object() && chunk.contains("error")) {
      saw_error = true;
      const json& e = chunk["error"];
      error_text = e.is_object() && e.contains("message") && e["message"].is_string() ? e["message"].get<std::string>()
                                                                                      : dump_safe(e);
      return;
    }
    if (chunk.contains("usage") && chunk["usage"].is_object()) turn.usage = chunk["usage"];
    if (!chunk.contains("choices") || !chunk["choices"].is_array() || chunk["choices"].empty()) return;
    const json& choice = chunk["choices"][0];
    if (choice.contains("finish_reason") && choice["finish_reason"].is_string()) {
      saw_finish = true;
      turn.finish_reason = choice["finish_reason"].get<std::string>();
    }
    if (!choice.contains("delta") || !choice["delta"].is_object()) return;
    const json& d = choice["delta"];
    bool token = false;
    if (d.contains("content") && d["content"].is_string() && !d["content"].get<std::string>().empty()) {
      turn.content += d["content"].get<std::string>();
      token = true;
    }
    for (const char* key : {"reasoning_content", "reasoning"}) {
      if (d.contains(key) && d[key].is_string() && !d[key].get<std::string>().empty()) {
        turn.reasoning += d[key].get<std::string>();
        token = true;
        break;
      }
    }
    if (d.contains("tool_calls") && d["tool_calls"].is_array()) {
      for (const auto& tc : d["tool_calls"]) {
        int index = tc.value("index", 0);
        json& call = calls[index];
        if (call.is_null()) call = {{"id", ""}, {"type", "function"}, {"function", {{"name", ""}, {"arguments", ""}}}};
        if (tc.contains("id") && tc["id"].is_string()) call["id"] = tc["id"];
        if (tc.contains("function") && tc["function"].is_object()) {
          const json& fn = tc["function"];
          if (fn.contains("name") && fn["name"].is_string())
            call["function"]["name"] = call["function"]["name"].get<std::string>() + fn["name"].get<std::string>();
          if (fn.contains("arguments") && fn["arguments"].is_string())
            call["function"]["arguments"] =
                call["function"]["arguments"].get<std::string>() + fn["arguments"].get<std::string>();
        }
        token = true;
      }
    }
    if (token) {
      ++turn.delta_events;
      if (!first_token) {
        first_token = true;
        turn.ttft_ms = ms_since_start();
      }
    }
  };
  try {
    http::fetch_stream(
        req, [&](int status, const std::map<std::string, std::string>&) { turn.status = status; },
        [&](std::string_view bytes) {
          if (turn.status != 200) {
            if (error_body.size() < 4096) error_body.append(bytes);
            return true;
          }
          for (const auto& ev : parser.feed(bytes)) take(ev);
          return true;
        });
    if (auto last = parser.finish()) take(*last);
  } catch (const http::ClientError& e) {
    turn.failure = e.what();
  }
  turn.total_ms = ms_since_start();
  for (auto& [i, call] : calls) turn.tool_calls.push_back(call);

  if (!turn.failure.empty()) {
    // Connection-level failure: keep the message.
  } else if (turn.status != 200) {
    turn.failure = "HTTP " + std::to_string(turn.status) + ": " + error_body.substr(0, 300);
  } else if (saw_error) {
    turn.failure = "error event: " + error_text;
  } else if (!saw_done) {
    turn.failure = saw_finish ? "stream ended without [DONE]" : "stream cut before its finish chunk";
  } else if (!saw_finish) {
    turn.failure = "[DONE] without a finish reason";
  } else if (turn.content.empty() && turn.reasoning.empty() && turn.tool_calls.empty()) {
    turn.failure = "HTTP 200 with an empty stream (no content, reasoning or tool call)";
  }
  turn.complete = turn.failure.empty();
  return turn;
}

}  // namespace servedeck::tools
