#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "common/stream_limits.hpp"
#include "gateway/anthropic/stream_translator.hpp"

using namespace servedeck::gateway::anthropic;
using nlohmann::json;

namespace {

json chunk(json delta, json finish = nullptr) {
  return {{"choices", json::array({{{"index", 0}, {"delta", std::move(delta)}, {"finish_reason", std::move(finish)}}})}};
}

std::vector<StreamEvent> run(StreamTranslator& t, const std::vector<json>& chunks, bool finish = true) {
  std::vector<StreamEvent> all = t.start();
  for (const auto& c : chunks)
    for (auto& e : t.on_chunk(c)) all.push_back(std::move(e));
  if (finish)
    for (auto& e : t.finish()) all.push_back(std::move(e));
  return all;
}

/// "message_start, content_block_start:thinking@0, content_block_delta:thinking_delta@0, …"
std::string shape(const std::vector<StreamEvent>& events) {
  std::string out;
  for (const auto& e : events) {
    out += (out.empty() ? "" : ", ") + e.type;
    if (e.type == "content_block_start")
      out += ":" + e.data["content_block"]["type"].get<std::string>() + "@" + std::to_string(e.data["index"].get<int>());
    if (e.type == "content_block_delta")
      out += ":" + e.data["delta"]["type"].get<std::string>() + "@" + std::to_string(e.data["index"].get<int>());
    if (e.type == "content_block_stop") out += "@" + std::to_string(e.data["index"].get<int>());
  }
  return out;
}

json tool_delta(int index, json fn, std::string id = "") {
  json tc = {{"index", index}, {"function", std::move(fn)}};
  if (!id.empty()) tc["id"] = id;
  return {{"tool_calls", json::array({tc})}};
}

}  // namespace

TEST_CASE("thinking, text and two tool calls stream as blocks 0..3, each type tracked per index, then message_delta and message_stop") {
  TranslatedRequest req;
  StreamTranslator t("msg_1", "tiny-chat", req);
  auto events = run(t, {chunk({{"role", "assistant"}, {"content", ""}}),
                        chunk({{"reasoning_content", "Let me "}}), chunk({{"reasoning_content", "think."}}),
                        chunk({{"content", "Two calls."}}),
                        chunk(tool_delta(0, {{"name", "get_weather"}, {"arguments", ""}}, "call_a")),
                        chunk(tool_delta(0, {{"arguments", "{\"city\":"}})), chunk(tool_delta(0, {{"arguments", "\"Paris\"}"}})),
                        chunk(tool_delta(1, {{"name", "get_time"}, {"arguments", "{}"}}, "call_b")),
                        chunk(json::object(), "tool_calls"),
                        {{"choices", json::array()}, {"usage", {{"prompt_tokens", 120}, {"completion_tokens", 30},
                                                                {"prompt_tokens_details", {{"cached_tokens", 100}}}}}}});
  CHECK(shape(events) ==
        "message_start, content_block_start:thinking@0, content_block_delta:thinking_delta@0, "
        "content_block_delta:thinking_delta@0, content_block_delta:signature_delta@0, content_block_stop@0, "
        "content_block_start:text@1, content_block_delta:text_delta@1, content_block_stop@1, "
        "content_block_start:tool_use@2, content_block_delta:input_json_delta@2, content_block_delta:input_json_delta@2, "
        "content_block_stop@2, content_block_start:tool_use@3, content_block_delta:input_json_delta@3, content_block_stop@3, "
        "message_delta, message_stop");
  CHECK(events[0].data["message"]["id"] == "msg_1");
  CHECK(events[0].data["message"]["model"] == "tiny-chat");
  CHECK(events[4].data["delta"]["signature"] == thinking_signature("Let me think."));
  CHECK(events[9].data["content_block"] == json{{"type", "tool_use"}, {"id", "call_a"}, {"name", "get_weather"}, {"input", json::object()}});
  const json& md = events[events.size() - 2].data;
  CHECK(md["delta"]["stop_reason"] == "tool_use");
  // Anthropic counts cache reads apart from input_tokens.
  CHECK(md["usage"] == json{{"input_tokens", 20}, {"output_tokens", 30}, {"cache_creation_input_tokens", 0},
                            {"cache_read_input_tokens", 100}});
  json msg = t.message();
  REQUIRE(msg["content"].size() == 4);
  CHECK(msg["content"][0] == json{{"type", "thinking"}, {"thinking", "Let me think."}, {"signature", thinking_signature("Let me think.")}});
  CHECK(msg["content"][2]["input"] == json{{"city", "Paris"}});
  CHECK(msg["stop_reason"] == "tool_use");
}

TEST_CASE("text after an open tool_use block opens a new text block: no text_delta ever goes into a tool_use block") {
  // Regression for "Content block is not a text block": translators that keep appending text
  // to the current index after a tool call started.
  TranslatedRequest req;
  StreamTranslator t("msg_2", "m", req);
  auto events = run(t, {chunk(tool_delta(0, {{"name", "Bash"}, {"arguments", "{\"command\":\"ls\"}"}}, "call_1")),
                        chunk({{"content", "done"}}), chunk(json::object(), "tool_calls")});
  CHECK(shape(events) ==
        "message_start, content_block_start:tool_use@0, content_block_delta:input_json_delta@0, content_block_stop@0, "
        "content_block_start:text@1, content_block_delta:text_delta@1, content_block_stop@1, message_delta, message_stop");
  std::map<int, std::string> type_at;
  for (const auto& e : events) {
    if (e.type == "content_block_start") type_at[e.data["index"]] = e.data["content_block"]["type"];
    if (e.type == "content_block_delta" && e.data["delta"]["type"] == "text_delta") CHECK(type_at[e.data["index"]] == "text");
    if (e.type == "content_block_delta" && e.data["delta"]["type"] == "input_json_delta") CHECK(type_at[e.data["index"]] == "tool_use");
  }
}

TEST_CASE("whitespace content between two argument fragments of one call is held: the arguments stay whole") {
  // Regression: header + `{"content": `, content "\n", then `"abc"}` closed the tool_use block at
  // the newline and dropped the rest of the arguments; the client got invalid partial_json and
  // a clean message_stop.
  TranslatedRequest req;
  StreamTranslator t("msg_ws", "m", req);
  auto events = run(t, {chunk(tool_delta(0, {{"name", "Write"}, {"arguments", "{\"content\": "}}, "call_w")),
                        chunk({{"content", "\n"}}), chunk(tool_delta(0, {{"arguments", "\"abc\"}"}})),
                        chunk({{"content", " \n"}}), chunk(json::object(), "tool_calls")});
  CHECK(shape(events) ==
        "message_start, content_block_start:tool_use@0, content_block_delta:input_json_delta@0, "
        "content_block_delta:input_json_delta@0, content_block_stop@0, message_delta, message_stop");
  std::string partial;
  for (const auto& e : events)
    if (e.type == "content_block_delta") partial += e.data["delta"]["partial_json"].get<std::string>();
  CHECK(json::parse(partial) == json{{"content", "abc"}});
  json msg = t.message();
  REQUIRE(msg["content"].size() == 1);
  CHECK(msg["content"][0]["input"] == json{{"content", "abc"}});
}

TEST_CASE("held whitespace goes before the next real text, in a text block of its own index") {
  TranslatedRequest req;
  StreamTranslator t("msg_ws2", "m", req);
  auto events = run(t, {chunk(tool_delta(0, {{"name", "Bash"}, {"arguments", "{}"}}, "call_1")), chunk({{"content", "\n\n"}}),
                        chunk({{"content", "Done."}}), chunk(json::object(), "tool_calls")});
  CHECK(shape(events) ==
        "message_start, content_block_start:tool_use@0, content_block_delta:input_json_delta@0, content_block_stop@0, "
        "content_block_start:text@1, content_block_delta:text_delta@1, content_block_stop@1, message_delta, message_stop");
  CHECK(t.message()["content"][1]["text"] == "\n\nDone.");
}

TEST_CASE("arguments for a call whose block was closed end the stream with an error event, never dropped") {
  TranslatedRequest req;
  SUBCASE("closed by text") {
    // (Arguments cut short where the text closes the block are an error there already: see
    // "tool arguments that are no JSON object".)
    StreamTranslator t("msg_late", "m", req);
    auto events = run(t, {chunk(tool_delta(0, {{"name", "Write"}, {"arguments", "{\"content\": \"a\"}"}}, "call_w")),
                          chunk({{"content", "oops"}}), chunk(tool_delta(0, {{"arguments", "{\"mode\": \"x\"}"}})),
                          chunk(json::object(), "tool_calls")});
    CHECK(shape(events) ==
          "message_start, content_block_start:tool_use@0, content_block_delta:input_json_delta@0, content_block_stop@0, "
          "content_block_start:text@1, content_block_delta:text_delta@1, error");
    CHECK(t.failed());
    const std::string message = events.back().data["error"]["message"];
    CHECK(message.find("'Write' (call_w, content block 0)") != std::string::npos);
  }
  SUBCASE("closed by the next call") {
    StreamTranslator t("msg_late2", "m", req);
    auto events = run(t, {chunk(tool_delta(0, {{"name", "a"}, {"arguments", "{\"x\":1}"}}, "call_a")),
                          chunk(tool_delta(1, {{"name", "b"}, {"arguments", "{}"}}, "call_b")),
                          chunk(tool_delta(0, {{"arguments", "{\"y\":2}"}})), chunk(json::object(), "tool_calls")});
    CHECK(events.back().type == "error");
    CHECK(events.back().data["error"]["message"].get<std::string>().find("'a' (call_a, content block 0)") != std::string::npos);
    CHECK(t.failed());
  }
}

TEST_CASE("message_start comes exactly once, however often start() or ping() is called") {
  TranslatedRequest req;
  StreamTranslator t("msg_3", "m", req);
  std::vector<StreamEvent> all = t.start();
  for (auto& e : t.start()) all.push_back(e);
  for (auto& e : t.ping()) all.push_back(e);
  for (auto& e : t.on_chunk(chunk({{"content", "hi"}}))) all.push_back(e);
  for (auto& e : t.ping()) all.push_back(e);
  for (auto& e : t.finish()) all.push_back(e);
  CHECK(shape(all) == "message_start, ping, content_block_start:text@0, content_block_delta:text_delta@0, ping, "
                      "content_block_stop@0, message_delta, message_stop");
  CHECK(t.ping().empty());  // nothing after the end
}

TEST_CASE("stop reasons: length is max_tokens, a matched stop sequence is stop_sequence, otherwise end_turn") {
  TranslatedRequest req;
  req.stop_sequences = {"END"};
  StreamTranslator a("m1", "m", req);
  auto ea = run(a, {chunk({{"content", "abc"}}), chunk(json::object(), "length")});
  CHECK(ea[ea.size() - 2].data["delta"]["stop_reason"] == "max_tokens");
  StreamTranslator b("m2", "m", req);
  json stop = chunk(json::object(), "stop");
  stop["choices"][0]["stop_reason"] = "END";
  auto eb = run(b, {chunk({{"content", "abc"}}), stop});
  CHECK(eb[eb.size() - 2].data["delta"] == json{{"stop_reason", "stop_sequence"}, {"stop_sequence", "END"}});
  StreamTranslator c("m3", "m", req);
  auto ec = run(c, {chunk({{"content", "abc"}}), chunk(json::object(), "stop")});
  CHECK(ec[ec.size() - 2].data["delta"] == json{{"stop_reason", "end_turn"}, {"stop_sequence", nullptr}});
}

TEST_CASE("a failure ends the stream with an error event and never a message_stop") {
  TranslatedRequest req;
  StreamTranslator t("msg_4", "m", req);
  auto events = run(t, {chunk({{"content", "partial"}})}, false);
  for (auto& e : t.fail("api_error", "the engine's stream ended before it completed")) events.push_back(e);
  for (auto& e : t.finish()) events.push_back(e);  // too late: nothing more
  CHECK(shape(events) == "message_start, content_block_start:text@0, content_block_delta:text_delta@0, error");
  CHECK(events.back().data == json{{"type", "error"}, {"error", {{"type", "api_error"}, {"message", "the engine's stream ended before it completed"}}}});
}

TEST_CASE("a non-streamed chat completion becomes a message with signed thinking, text and a tool_use input object") {
  TranslatedRequest req;
  json completion = {{"id", "c"}, {"object", "chat.completion"},
                     {"choices", json::array({{{"index", 0}, {"finish_reason", "tool_calls"},
                                               {"message", {{"role", "assistant"}, {"reasoning_content", "plan"}, {"content", "Reading."},
                                                            {"tool_calls", json::array({{{"id", "call_9"}, {"type", "function"},
                                                                                         {"function", {{"name", "Read"}, {"arguments", "{\"file_path\":\"/a\"}"}}}}})}}}}})},
                     {"usage", {{"prompt_tokens", 50}, {"completion_tokens", 7}, {"total_tokens", 57}}}};
  json msg = translate_completion(completion, "msg_x", "tiny", req);
  CHECK(msg == json{{"id", "msg_x"}, {"type", "message"}, {"role", "assistant"}, {"model", "tiny"},
                    {"content", json::array({{{"type", "thinking"}, {"thinking", "plan"}, {"signature", thinking_signature("plan")}},
                                             {{"type", "text"}, {"text", "Reading."}},
                                             {{"type", "tool_use"}, {"id", "call_9"}, {"name", "Read"}, {"input", {{"file_path", "/a"}}}}})},
                    {"stop_reason", "tool_use"}, {"stop_sequence", nullptr},
                    {"usage", {{"input_tokens", 50}, {"output_tokens", 7}, {"cache_creation_input_tokens", 0}, {"cache_read_input_tokens", 0}}}});
}

TEST_CASE("the thinking signature is stable and differs between texts; error types follow the HTTP status") {
  CHECK(thinking_signature("abc") == thinking_signature("abc"));
  CHECK(thinking_signature("abc") != thinking_signature("abd"));
  CHECK(thinking_signature("").rfind("servedeck-v1.", 0) == 0);
  CHECK(thinking_signature("").size() == 13 + 16);
  CHECK(error_type_for_status(400) == "invalid_request_error");
  CHECK(error_type_for_status(401) == "authentication_error");
  CHECK(error_type_for_status(403) == "permission_error");
  CHECK(error_type_for_status(404) == "not_found_error");
  CHECK(error_type_for_status(409) == "invalid_request_error");
  CHECK(error_type_for_status(413) == "request_too_large");
  CHECK(error_type_for_status(429) == "rate_limit_error");
  CHECK(error_type_for_status(500) == "api_error");
  CHECK(error_type_for_status(502) == "api_error");
  CHECK(error_type_for_status(503) == "overloaded_error");
  CHECK(error_type_for_status(529) == "overloaded_error");
}

TEST_CASE("tool arguments that are no JSON object are an error, never input {}") {
  // Regression: unparseable (or too deeply nested) arguments became `input: {}`, a call that
  // looks right and is not the one the engine made.
  TranslatedRequest req;
  const std::string deep = "{\"a\":" + std::string(300, '[') + std::string(300, ']') + "}";
  for (const std::string& args : {std::string("{\"command\": \"ls"), std::string("[1, 2]"), deep}) {
    CAPTURE(args.substr(0, 40));
    json completion = {{"choices", json::array({{{"index", 0}, {"finish_reason", "tool_calls"},
                                                 {"message", {{"role", "assistant"},
                                                              {"tool_calls", json::array({{{"id", "call_b"}, {"type", "function"},
                                                                                           {"function", {{"name", "Bash"}, {"arguments", args}}}}})}}}}})}};
    std::string why;
    CHECK(translate_completion(completion, "msg_b", "m", req, &why).is_null());
    CHECK(why.find("tool call 'Bash' (call_b)") != std::string::npos);
    CHECK(why.find(args.substr(0, 10)) != std::string::npos);

    StreamTranslator t("msg_bs", "m", req);
    auto events = run(t, {chunk(tool_delta(0, {{"name", "Bash"}, {"arguments", args}}, "call_b")), chunk(json::object(), "tool_calls")});
    CHECK(shape(events) == "message_start, content_block_start:tool_use@0, content_block_delta:input_json_delta@0, error");
    CHECK(t.failed());
  }
  CHECK(tool_input_error("Bash", "c", deep)->find("nested deeper than 256") != std::string::npos);
  CHECK(tool_input_error("Bash", "c", "[1]")->find("a JSON array, not an object") != std::string::npos);
  CHECK_FALSE(tool_input_error("Bash", "c", "").has_value());
  CHECK_FALSE(tool_input_error("Bash", "c", "{\"a\": 1}").has_value());
}

TEST_CASE("an answer past k_max_stream_text_bytes ends with an error event, never cut silently") {
  TranslatedRequest req;
  StreamTranslator t("msg_big", "m", req);
  (void)t.start();
  const json piece = chunk({{"content", std::string(std::size_t{16} << 20, 'x')}});
  std::vector<StreamEvent> last;
  std::size_t sent = 0;
  while (!t.ended() && sent <= servedeck::k_max_stream_text_bytes) {
    last = t.on_chunk(piece);
    sent += std::size_t{16} << 20;
  }
  REQUIRE(t.failed());
  CHECK(sent > servedeck::k_max_stream_text_bytes);
  REQUIRE_FALSE(last.empty());
  CHECK(last.back().type == "error");
  CHECK(last.back().data["error"]["message"].get<std::string>().find(std::to_string(servedeck::k_max_stream_text_bytes >> 20) + " MiB") != std::string::npos);
  CHECK(t.finish().empty());  // no message_stop after it
}

TEST_CASE("an engine's negative token counts read as 0, never a negative cache_read_input_tokens") {
  TranslatedRequest req;
  StreamTranslator t("msg_neg", "tiny", req);
  const json usage = {{"prompt_tokens", -5}, {"completion_tokens", -2}, {"prompt_tokens_details", {{"cached_tokens", 3}}}};
  auto all = run(t, {chunk({{"content", "hi"}}), {{"choices", json::array()}, {"usage", usage}}});
  REQUIRE(all[all.size() - 2].type == "message_delta");
  CHECK(all[all.size() - 2].data["usage"] == json{{"input_tokens", 0}, {"output_tokens", 0}, {"cache_creation_input_tokens", 0},
                                                  {"cache_read_input_tokens", 0}});
}

TEST_CASE("an engine's finish_reason abort or error ends with an error event, streamed or not; unknown reasons stay end_turn") {
  TranslatedRequest req;
  for (const char* reason : {"abort", "error"}) {
    CAPTURE(reason);
    StreamTranslator t("msg_a", "m", req);
    auto events = run(t, {chunk({{"content", "partial"}}), chunk(json::object(), reason)});
    CHECK(shape(events) == "message_start, content_block_start:text@0, content_block_delta:text_delta@0, error");
    CHECK(events.back().data["error"]["message"].get<std::string>().find(std::string("finish_reason '") + reason + "'") !=
          std::string::npos);
    const json completion = {{"choices", json::array({{{"index", 0}, {"message", {{"role", "assistant"}, {"content", "partial"}}},
                                                        {"finish_reason", reason}}})}};
    std::string why;
    CHECK(translate_completion(completion, "msg_b", "m", req, &why).is_null());
    CHECK(why.find("the output so far is incomplete") != std::string::npos);
  }
  StreamTranslator t("msg_c", "m", req);
  auto events = run(t, {chunk({{"content", "done"}}), chunk(json::object(), "eos_token")});
  CHECK(events.back().type == "message_stop");
  CHECK(events[events.size() - 2].data["delta"]["stop_reason"] == "end_turn");
}
