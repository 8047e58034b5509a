#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "common/stream_limits.hpp"
#include "gateway/responses/stream_translator.hpp"

using namespace servedeck::gateway::responses;
using nlohmann::json;

namespace {

json chunk(json delta, json finish = nullptr) {
  return {{"object", "chat.completion.chunk"},
          {"choices", json::array({{{"index", 0}, {"delta", delta}, {"finish_reason", finish}}})}};
}

std::vector<std::string> types(const std::vector<StreamEvent>& events) {
  std::vector<std::string> out;
  for (const auto& e : events) out.push_back(e.type);
  return out;
}

void append(std::vector<StreamEvent>& all, std::vector<StreamEvent> more) {
  for (auto& e : more) all.push_back(std::move(e));
}

TranslatedRequest namespaced_request() {
  TranslatedRequest req;
  req.tool_names["mcp_fs__read"] = ToolOrigin{"mcp_fs", "read"};
  req.echo["tools"] = json::array();
  return req;
}

}  // namespace

TEST_CASE("a recorded stream (reasoning, text, namespaced tool call) gives the exact Responses event sequence") {
  TranslatedRequest req = namespaced_request();
  StreamTranslator t("resp_1", "tiny-high", 1700000000, req);
  std::vector<StreamEvent> all = t.start();
  append(all, t.on_chunk(chunk({{"role", "assistant"}, {"content", ""}})));
  append(all, t.on_chunk(chunk({{"reasoning_content", "Let me "}})));
  append(all, t.on_chunk(chunk({{"reasoning", "look."}})));  // the other dialect (G20)
  append(all, t.on_chunk(chunk({{"content", "Reading "}})));
  append(all, t.on_chunk(chunk({{"content", "a.txt"}})));
  append(all, t.on_chunk(chunk({{"tool_calls", json::array({{{"index", 0}, {"id", "call_9"}, {"type", "function"},
                                                              {"function", {{"name", "mcp_fs__read"}, {"arguments", "{\"pa"}}}}})}})));
  append(all, t.on_chunk(chunk({{"tool_calls", json::array({{{"index", 0}, {"function", {{"arguments", "th\":\"a.txt\"}"}}}}})}})));
  append(all, t.on_chunk(chunk(json::object(), "tool_calls")));
  append(all, t.on_chunk({{"choices", json::array()}, {"usage", {{"prompt_tokens", 40}, {"completion_tokens", 12}, {"total_tokens", 52}}}}));
  append(all, t.finish());

  const std::vector<std::string> expected = {
      "response.created", "response.in_progress",
      "response.output_item.added", "response.reasoning_text.delta", "response.reasoning_text.delta",
      "response.reasoning_text.done", "response.output_item.done",
      "response.output_item.added", "response.content_part.added", "response.output_text.delta",
      "response.output_text.delta", "response.output_text.done", "response.content_part.done",
      "response.output_item.done",
      "response.output_item.added", "response.function_call_arguments.delta", "response.function_call_arguments.delta",
      "response.function_call_arguments.done", "response.output_item.done",
      "response.completed"};
  CHECK(types(all) == expected);
  for (std::size_t i = 0; i < all.size(); ++i) CHECK(all[i].data["sequence_number"] == static_cast<int64_t>(i));

  const json& done = all.back().data["response"];
  CHECK(done["status"] == "completed");
  CHECK(done["model"] == "tiny-high");
  REQUIRE(done["output"].size() == 3);
  CHECK(done["output"][0]["type"] == "reasoning");
  CHECK(done["output"][0]["content"][0]["text"] == "Let me look.");
  CHECK(done["output"][1]["content"][0]["text"] == "Reading a.txt");
  CHECK(done["output"][2]["type"] == "function_call");
  CHECK(done["output"][2]["name"] == "read");        // mapped back from the flattened name
  CHECK(done["output"][2]["namespace"] == "mcp_fs");
  CHECK(done["output"][2]["call_id"] == "call_9");
  CHECK(done["output"][2]["arguments"] == "{\"path\":\"a.txt\"}");
  CHECK(done["usage"]["input_tokens"] == 40);
  CHECK(done["usage"]["output_tokens"] == 12);
  CHECK(done["usage"]["total_tokens"] == 52);

  // Stored history keeps the engine-side name and the reasoning.
  json history = t.assistant_messages();
  CHECK(history[0]["reasoning_content"] == "Let me look.");
  CHECK(history[0]["tool_calls"][0]["function"]["name"] == "mcp_fs__read");
}

TEST_CASE("G32: an upstream failure after output_item.added ends with response.failed") {
  TranslatedRequest req = namespaced_request();
  StreamTranslator t("resp_2", "tiny", 1, req);
  std::vector<StreamEvent> all = t.start();
  append(all, t.on_chunk(chunk({{"tool_calls", json::array({{{"index", 0}, {"id", "call_1"},
                                                              {"function", {{"name", "mcp_fs__read"}, {"arguments", "{"}}}}})}})));
  append(all, t.fail("upstream_closed", "the engine closed the stream before its finish chunk"));
  REQUIRE(all.size() == 5);
  CHECK(all[2].type == "response.output_item.added");
  CHECK(all.back().type == "response.failed");
  CHECK(all.back().data["response"]["status"] == "failed");
  CHECK(all.back().data["response"]["error"]["code"] == "upstream_closed");
  CHECK(t.ended());
  CHECK(t.finish().empty());  // nothing after a terminal event
  CHECK(all.back().to_sse().rfind("event: response.failed\ndata: {", 0) == 0);
}

TEST_CASE("finish length gives response.incomplete with the reason, and the cut message item is incomplete") {
  TranslatedRequest req;
  StreamTranslator t("resp_3", "tiny", 1, req);
  std::vector<StreamEvent> all = t.start();
  append(all, t.on_chunk(chunk({{"reasoning_content", "hmm"}})));
  append(all, t.on_chunk(chunk({{"content", "partial"}}, "length")));
  append(all, t.finish());
  CHECK(all.back().type == "response.incomplete");
  const json& r = all.back().data["response"];
  CHECK(r["status"] == "incomplete");
  CHECK(r["incomplete_details"]["reason"] == "max_output_tokens");
  REQUIRE(r["output"].size() == 2);
  CHECK(r["output"][0]["type"] == "reasoning");
  CHECK(r["output"][0]["status"] == "completed");  // closed whole before the message began
  CHECK(r["output"][1]["type"] == "message");
  CHECK(r["output"][1]["status"] == "incomplete");
  CHECK(r["output"][1]["content"][0]["text"] == "partial");

  // Each output_item.done says what the final object says about that item.
  std::vector<json> done_items;
  for (const auto& e : all)
    if (e.type == "response.output_item.done") done_items.push_back(e.data["item"]);
  REQUIRE(done_items.size() == 2);
  CHECK(done_items[0]["status"] == "completed");
  CHECK(done_items[1]["type"] == "message");
  CHECK(done_items[1]["status"] == "incomplete");
}

TEST_CASE("finish length while a tool call's arguments stream: the cut call is incomplete, the message before it completed") {
  TranslatedRequest req;
  StreamTranslator t("resp_5", "tiny", 1, req);
  std::vector<StreamEvent> all = t.start();
  append(all, t.on_chunk(chunk({{"content", "Reading"}})));
  append(all, t.on_chunk(chunk({{"tool_calls", json::array({{{"index", 0}, {"id", "call_1"},
                                                              {"function", {{"name", "read"}, {"arguments", "{\"pa"}}}}})}},
                               "length")));
  append(all, t.finish());
  CHECK(all.back().type == "response.incomplete");
  const json& r = all.back().data["response"];
  REQUIRE(r["output"].size() == 2);
  CHECK(r["output"][0]["status"] == "completed");
  CHECK(r["output"][1]["type"] == "function_call");
  CHECK(r["output"][1]["status"] == "incomplete");
  CHECK(r["output"][1]["arguments"] == "{\"pa");
}

TEST_CASE("a non-streaming chat.completion cut at its token limit: response and message both incomplete") {
  TranslatedRequest req;
  json completion = {{"object", "chat.completion"},
                     {"choices", json::array({{{"index", 0}, {"finish_reason", "length"},
                                                {"message", {{"role", "assistant"}, {"content", "Hello fr"}}}}})},
                     {"usage", {{"prompt_tokens", 3}, {"completion_tokens", 4}, {"total_tokens", 7}}}};
  json r = translate_completion(completion, "resp_6", "tiny", 5, req);
  CHECK(r["status"] == "incomplete");
  CHECK(r["incomplete_details"]["reason"] == "max_output_tokens");
  REQUIRE(r["output"].size() == 1);
  CHECK(r["output"][0]["type"] == "message");
  CHECK(r["output"][0]["status"] == "incomplete");
  CHECK(r["output"][0]["content"][0]["text"] == "Hello fr");
}

TEST_CASE("a non-streaming chat.completion translates to the same output items") {
  TranslatedRequest req = namespaced_request();
  json completion = {{"object", "chat.completion"},
                     {"choices", json::array({{{"index", 0}, {"finish_reason", "stop"},
                                                {"message", {{"role", "assistant"}, {"content", "hello"},
                                                             {"reasoning_content", "think"}}}}})},
                     {"usage", {{"prompt_tokens", 3}, {"completion_tokens", 2}, {"total_tokens", 5}}}};
  json r = translate_completion(completion, "resp_4", "tiny", 5, req);
  CHECK(r["status"] == "completed");
  REQUIRE(r["output"].size() == 2);
  CHECK(r["output"][0]["type"] == "reasoning");
  CHECK(r["output"][1]["content"][0]["text"] == "hello");
  CHECK(r["output"][1]["status"] == "completed");
  CHECK(r["usage"]["total_tokens"] == 5);
}

TEST_CASE("text between two argument fragments of one call: the function_call item keeps every argument") {
  // The pattern that lost arguments on the Messages bridge: a call item stays open until the
  // end here, so text between its fragments goes into a message item and the arguments stay whole.
  TranslatedRequest req;
  StreamTranslator t("resp_ws", "m", 1, req);
  std::vector<StreamEvent> all = t.start();
  append(all, t.on_chunk(chunk({{"tool_calls", json::array({{{"index", 0}, {"id", "call_w"}, {"type", "function"},
                                                              {"function", {{"name", "write"}, {"arguments", "{\"content\": "}}}}})}})));
  append(all, t.on_chunk(chunk({{"content", "\n"}})));
  append(all, t.on_chunk(chunk({{"tool_calls", json::array({{{"index", 0}, {"function", {{"arguments", "\"abc\"}"}}}}})}})));
  append(all, t.on_chunk(chunk(json::object(), "tool_calls")));
  append(all, t.finish());
  std::string deltas, done;
  for (const auto& e : all) {
    if (e.type == "response.function_call_arguments.delta") deltas += e.data["delta"].get<std::string>();
    if (e.type == "response.function_call_arguments.done") done = e.data["arguments"];
  }
  CHECK(json::parse(deltas) == json{{"content", "abc"}});
  CHECK(done == deltas);
  json r = t.response();
  CHECK(r["status"] == "completed");
  bool found = false;
  for (const auto& item : r["output"])
    if (item["type"] == "function_call") {
      found = true;
      CHECK(item["arguments"] == "{\"content\": \"abc\"}");
    }
  CHECK(found);
}

TEST_CASE("an answer past k_max_stream_text_bytes ends as response.failed stream_too_large, never cut silently") {
  TranslatedRequest req;
  StreamTranslator t("resp_big", "m", 1, req);
  (void)t.start();
  const json piece = chunk({{"reasoning_content", std::string(std::size_t{16} << 20, 'x')}});
  std::vector<StreamEvent> last;
  std::size_t sent = 0;
  while (!t.ended() && sent <= servedeck::k_max_stream_text_bytes) {
    last = t.on_chunk(piece);
    sent += std::size_t{16} << 20;
  }
  REQUIRE(t.ended());
  CHECK(sent > servedeck::k_max_stream_text_bytes);
  REQUIRE_FALSE(last.empty());
  CHECK(last.back().type == "response.failed");
  CHECK(t.response()["error"]["code"] == "stream_too_large");
  CHECK(t.finish().empty());
}

TEST_CASE("finish content_filter gives response.incomplete with reason content_filter, never response.completed") {
  TranslatedRequest req;
  StreamTranslator t("resp_cf", "tiny", 1, req);
  std::vector<StreamEvent> all = t.start();
  append(all, t.on_chunk(chunk({{"content", "The answer is"}})));
  append(all, t.on_chunk(chunk(json::object(), "content_filter")));
  append(all, t.finish());
  CHECK(all.back().type == "response.incomplete");
  const json& r = all.back().data["response"];
  CHECK(r["status"] == "incomplete");
  CHECK(r["incomplete_details"]["reason"] == "content_filter");
  REQUIRE(r["output"].size() == 1);
  CHECK(r["output"][0]["status"] == "incomplete");

  // The whole (non-streamed) answer says the same.
  const json completion = {{"choices", json::array({{{"index", 0}, {"message", {{"role", "assistant"}, {"content", "The answer is"}}},
                                                      {"finish_reason", "content_filter"}}})}};
  const json whole = translate_completion(completion, "resp_cf2", "tiny", 1, req);
  CHECK(whole["status"] == "incomplete");
  CHECK(whole["incomplete_details"]["reason"] == "content_filter");
}

TEST_CASE("an engine's finish_reason abort or error gives response.failed, streamed or not, never response.completed") {
  TranslatedRequest req;
  for (const char* reason : {"abort", "error"}) {
    CAPTURE(reason);
    StreamTranslator t("resp_ab", "tiny", 1, req);
    std::vector<StreamEvent> all = t.start();
    append(all, t.on_chunk(chunk({{"content", "The answer is"}})));
    append(all, t.on_chunk(chunk(json::object(), reason)));
    append(all, t.finish());
    CHECK(all.back().type == "response.failed");
    const json& r = all.back().data["response"];
    CHECK(r["status"] == "failed");
    CHECK(r["error"]["code"] == "engine_aborted");
    CHECK(r["error"]["message"].get<std::string>().find(std::string("finish_reason '") + reason + "'") != std::string::npos);
    const json completion = {{"choices", json::array({{{"index", 0}, {"message", {{"role", "assistant"}, {"content", "The answer is"}}},
                                                        {"finish_reason", reason}}})}};
    CHECK(translate_completion(completion, "resp_ab2", "tiny", 1, req)["status"] == "failed");
  }
}
