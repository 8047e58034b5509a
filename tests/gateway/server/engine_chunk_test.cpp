// engine_chunk_error: which parsed engine events are completion chunks, and what the error for one
// that is not says (the field, the value read, the range expected). Inputs from a hostile fake
// engine that the gateway used to drop silently, or whose indexes it read as `int`.
#include <doctest/doctest.h>

#include <string>

#include <nlohmann/json.hpp>

#include "gateway/server/engine_chunk.hpp"
#include "gateway/server/stream_normalizer.hpp"

using nlohmann::json;
using servedeck::gateway::engine_chunk_error;
using servedeck::gateway::EngineChunkShape;
using servedeck::gateway::k_max_stream_tool_calls;
using servedeck::gateway::requested_choices;

namespace {

/// The error for `text` (one engine event) on a chat stream asking for `n` choices.
std::string error_for(const std::string& text, int64_t n = 1, bool chat = true) {
  return engine_chunk_error(json::parse(text), EngineChunkShape{n, chat});
}

std::string tool_chunk(const std::string& index) {
  return R"({"choices":[{"index":0,"delta":{"tool_calls":[{"index":)" + index +
         R"(,"id":"call_b","function":{"name":"f","arguments":"{}"}}]}}]})";
}

}  // namespace

TEST_CASE("what real engines stream is accepted: content, tool calls, usage-only and timings-only tails") {
  for (const char* ok : {
           R"({"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]})",
           R"({"choices":[{"index":0,"delta":{"content":"hi"},"logprobs":null,"finish_reason":null}]})",
           R"({"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_a","type":"function","function":{"name":"f","arguments":""}}]}}]})",
           R"({"choices":[{"index":0,"delta":{"tool_calls":null,"content":"x"}}]})",  // G11: null optional field
           R"({"choices":[{"delta":{"tool_calls":[{"function":{"arguments":"{}"}}]}}]})",  // no indexes at all
           R"({"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}})",  // vLLM's usage chunk
           R"({"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}})",  // no choices key
           R"({"timings":{"predicted_n":4}})",                                          // llama-server
       }) {
    CAPTURE(ok);
    CHECK(error_for(ok) == "");
  }
  CHECK(error_for(tool_chunk(std::to_string(k_max_stream_tool_calls - 1))) == "");
  CHECK(error_for(R"({"choices":[{"index":2,"delta":{"content":"c"}}]})", 3) == "");
  CHECK(error_for(R"({"choices":[{"index":0,"text":"ab","finish_reason":null}]})", 1, false) == "");
}

TEST_CASE("valid JSON that is not a chunk names what was read and that a choices array was expected") {
  struct Case {
    const char* event;
    const char* read;
  };
  for (const Case& c : {Case{"[1,2,3]", "'[1,2,3]' (array)"}, Case{"42", "'42' (number)"}, Case{"null", "'null' (null)"},
                        Case{R"("str")", R"('"str"' (string))"}, Case{"true", "'true' (boolean)"}}) {
    CAPTURE(c.event);
    const std::string e = error_for(c.event);
    CHECK(e.find("not a completion chunk") != std::string::npos);
    CHECK(e.find(std::string("read ") + c.read) != std::string::npos);
    CHECK(e.find("expected a chat.completion.chunk: a JSON object with a \"choices\" array") != std::string::npos);
  }
  const std::string e = error_for(R"({"choices":{"index":0,"delta":{"content":"LOST"}}})");
  CHECK(e.find(R"("choices" is not an array: read '{"delta":{"content":"LOST"},"index":0}' (object))") != std::string::npos);
  CHECK(error_for(R"({"choices":null})").find("read 'null' (null)") != std::string::npos);
  CHECK(error_for(R"({"choices":[{"index":0,"delta":{}},7]})") == "the engine sent choices[1] = '7' (number); expected a choice object");
  CHECK(error_for("[]", 1, false).find("expected a text_completion chunk") != std::string::npos);
}

TEST_CASE("what is quoted from the engine is bounded and one line") {
  const std::string big = "[\"" + std::string(100000, 'x') + "\\n\"]";
  const std::string e = error_for(big);
  CHECK(e.size() < servedeck::gateway::k_max_quoted_event_bytes + 200);
  CHECK(e.find('\n') == std::string::npos);
  CHECK(e.find("\xe2\x80\xa6") != std::string::npos);  // cut, and marked so
}

TEST_CASE("a choice index must be an integer in [0, n): -7, 1, 1e18, 4294967296, \"0\" and 0.0 are refused for n = 1") {
  for (const char* index : {"-7", "1", "1e18", "1000000000", "4294967296", "18446744073709551615", R"("0")", "0.0", "null"}) {
    CAPTURE(index);
    const std::string e = error_for(std::string(R"({"choices":[{"index":)") + index + R"(,"delta":{"content":"x"}}]})");
    CHECK(e.find("choices[0].index = '" + json::parse(index).dump() + "'") != std::string::npos);  // 1e18 reads 1e+18
    CHECK(e.find("expected an integer in [0, 1) (the request's n)") != std::string::npos);
  }
  CHECK(error_for(R"({"choices":[{"index":3,"delta":{}}]})", 3).find("[0, 3)") != std::string::npos);
}

TEST_CASE("a tool-call index must be an integer in [0, k_max_stream_tool_calls)") {
  const std::string range = "expected an integer in [0, " + std::to_string(k_max_stream_tool_calls) + ") (k_max_stream_tool_calls)";
  for (const std::string& index : {std::string("4294967296"), std::string("1000000000"), std::string("-1"), std::string("1e18"),
                                  std::to_string(k_max_stream_tool_calls), std::string(R"("1")")}) {
    CAPTURE(index);
    const std::string e = error_for(tool_chunk(index));
    CHECK(e.find("choices[0].delta.tool_calls[0].index = '" + json::parse(index).dump() + "'") != std::string::npos);
    CHECK(e.find(range) != std::string::npos);
  }
  // A text completion stream has no tool calls: its deltas are not read.
  CHECK(error_for(tool_chunk("-1"), 1, false) == "");
}

TEST_CASE("requested_choices: the request's n when a positive integer, else 1") {
  CHECK(requested_choices(json::parse(R"({"n":3})")) == 3);
  CHECK(requested_choices(json::parse(R"({})")) == 1);
  CHECK(requested_choices(json::parse(R"({"n":0})")) == 1);
  CHECK(requested_choices(json::parse(R"({"n":-2})")) == 1);
  CHECK(requested_choices(json::parse(R"({"n":2.0})")) == 1);
  CHECK(requested_choices(json::parse(R"({"n":"2"})")) == 1);
  CHECK(requested_choices(json::parse(R"({"n":18446744073709551615})")) == 1);
  CHECK(requested_choices(json::parse("[]")) == 1);
}
