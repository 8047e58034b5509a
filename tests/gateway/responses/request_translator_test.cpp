#include <doctest/doctest.h>

#include <fstream>
#include <span>
#include <sstream>

#include "gateway/responses/request_translator.hpp"

using namespace servedeck::gateway::responses;
using nlohmann::json;

static json load_fixture(const std::string& name) {
  std::ifstream in(std::string(SERVEDECK_SOURCE_DIR) + "/tests/gateway/responses/fixtures/" + name);
  REQUIRE(in.good());
  std::stringstream ss;
  ss << in.rdbuf();
  return json::parse(ss.str());
}

namespace {

/// Each (body, message): translate_request refuses the body with exactly that message.
void check_refusals(std::span<const std::pair<const char*, const char*>> cases) {
  for (const auto& [body, message] : cases) {
    INFO(body);
    TranslatedRequest t;
    const auto err = translate_request(json::parse(body), nullptr, t);
    REQUIRE(err.has_value());
    CHECK(*err == message);
  }
}

}  // namespace

TEST_CASE("G33: a Codex multi-turn request becomes chat messages, tools flattened, unknown output dropped") {
  json body = load_fixture("codex_multi_turn_request.json");
  TranslatedRequest t;
  REQUIRE_FALSE(translate_request(body, nullptr, t).has_value());
  const json& chat = t.chat;
  CHECK(chat["model"] == "tiny-high");
  CHECK(chat["stream"] == true);
  CHECK(chat["stream_options"]["include_usage"] == true);
  CHECK(chat["reasoning_effort"] == "high");
  CHECK(chat["parallel_tool_calls"] == false);
  CHECK(t.store == false);

  const json& m = chat["messages"];
  REQUIRE(m.size() == 10);
  CHECK(m[0] == json{{"role", "system"}, {"content", "You are a coding agent running in a terminal."}});
  CHECK(m[1] == json{{"role", "system"}, {"content", "<permissions>workspace-write</permissions>"}});
  CHECK(m[2]["role"] == "user");
  CHECK(m[3] == json{{"role", "user"}, {"content", "list the files"}});
  // The reasoning item lands on the assistant turn it belongs to, never in content.
  CHECK(m[4]["role"] == "assistant");
  CHECK(m[4]["content"] == "");
  CHECK(m[4]["reasoning_content"] == "I should run ls.");
  REQUIRE(m[4]["tool_calls"].size() == 1);
  CHECK(m[4]["tool_calls"][0]["id"] == "call_abc");
  CHECK(m[4]["tool_calls"][0]["function"]["name"] == "shell");
  CHECK(m[4]["tool_calls"][0]["function"]["arguments"] == "{\"command\":[\"ls\"]}");
  CHECK(m[5] == json{{"role", "tool"}, {"tool_call_id", "call_abc"}, {"content", "a.txt\nb.txt"}});
  // Namespaced call: flattened name; array output joined.
  CHECK(m[6]["tool_calls"][0]["function"]["name"] == "mcp_fs__read");
  CHECK(m[7] == json{{"role", "tool"}, {"tool_call_id", "call_def"}, {"content", "hello world"}});
  CHECK(m[8]["role"] == "assistant");
  CHECK(m[8]["content"] == "a.txt says hello world.");
  CHECK(m[9] == json{{"role", "user"}, {"content", "thanks"}});
}

TEST_CASE("translated tools: functions kept, namespace flattened with a map back, others dropped and logged") {
  json body = load_fixture("codex_multi_turn_request.json");
  TranslatedRequest t;
  REQUIRE_FALSE(translate_request(body, nullptr, t).has_value());
  const json& tools = t.chat["tools"];
  REQUIRE(tools.size() == 2);
  CHECK(tools[0]["function"]["name"] == "shell");
  CHECK(tools[0]["function"]["parameters"]["required"][0] == "command");
  CHECK(tools[1]["function"]["name"] == "mcp_fs__read");
  REQUIRE(t.tool_names.count("mcp_fs__read") == 1);
  CHECK(t.tool_names["mcp_fs__read"].ns == "mcp_fs");
  CHECK(t.tool_names["mcp_fs__read"].name == "read");
  std::string all;
  for (const auto& w : t.warnings) all += w + "\n";
  CHECK(all.find("dropped tool of type 'web_search'") != std::string::npos);
  CHECK(all.find("dropped tool of type 'custom'") != std::string::npos);
  CHECK(all.find("unknown call_id 'call_unknown'") != std::string::npos);
}

TEST_CASE("fields of the wrong type are a 400-style error, never an exception (found by the bad-input review)") {
  const char* bodies[] = {
      R"({"model":"tiny","input":"hi","stream":"yes"})",
      R"({"model":"tiny","input":"hi","store":"yes"})",
      R"({"model":"tiny","input":[{"type":5}]})",
      R"({"model":"tiny","input":[{"role":5,"content":"hi"}]})",
      R"({"model":"tiny","input":[{"type":"function_call","call_id":5,"name":"f","arguments":"{}"}]})",
      R"({"model":"tiny","input":"hi","tools":[{"type":5}]})",
      R"({"model":"tiny","input":"hi","tools":[{"type":"namespace","name":5,"tools":[{"name":"f"}]}]})",
      R"({"model":"tiny","input":"hi","tool_choice":{"type":"function","name":5}})",
      R"({"model":"tiny","input":"hi","text":{"format":{"type":"json_schema","name":5}}})",
  };
  for (const char* b : bodies) {
    TranslatedRequest t;
    std::optional<std::string> err;
    CHECK_NOTHROW(err = translate_request(json::parse(b), nullptr, t));
    INFO(b);
    if (err) CHECK(err->find("wrong type") != std::string::npos);
  }
}

TEST_CASE("input whose every item is dropped says why, not that input is missing") {
  TranslatedRequest t;
  auto err = translate_request(json::parse(R"({"model":"tiny","input":[{"type":"message","role":"robot","content":"x"}]})"), nullptr, t);
  REQUIRE(err.has_value());
  CHECK(*err == "'input' has no item the bridge can translate: dropped input item 0: unknown role 'robot'");
  err = translate_request(json::parse(R"({"model":"tiny","input":[]})"), nullptr, t);
  REQUIRE(err.has_value());
  CHECK(*err == "'input' has no item the bridge can translate (it is empty)");
  err = translate_request(json::parse(R"({"model":"tiny"})"), nullptr, t);
  REQUIRE(err.has_value());
  CHECK(*err == "'input' is required");
}

TEST_CASE("a top-level field of the wrong type is named with what was read and what was expected") {
  const std::pair<const char*, const char*> cases[] = {
      {R"({"model":"tiny","input":"hi","max_output_tokens":"5"})", "field 'max_output_tokens' has the wrong type: expected an integer, got string"},
      {R"({"model":"tiny","input":"hi","max_output_tokens":-5})", "field 'max_output_tokens' must be a positive integer, got -5"},
      {R"({"model":"tiny","input":"hi","max_output_tokens":0})", "field 'max_output_tokens' must be a positive integer, got 0"},
      {R"({"model":"tiny","input":"hi","previous_response_id":5})", "field 'previous_response_id' has the wrong type: expected a string, got number"},
      {R"({"model":"tiny","input":"hi","stream":"yes"})", "field 'stream' has the wrong type: expected a boolean, got string"},
      {R"({"model":"tiny","input":"hi","tools":"x"})", "field 'tools' has the wrong type: expected an array, got string"},
      {R"({"model":"tiny","input":"hi","instructions":5})", "field 'instructions' has the wrong type: expected a string, got number"},
      {R"({"model":"tiny","input":"hi","reasoning":"x"})", "field 'reasoning' has the wrong type: expected an object, got string"},
      {R"({"model":"tiny","input":5})", "field 'input' has the wrong type: expected a string or an array, got number"},
  };
  check_refusals(cases);
  // null is absent; a well-typed request passes.
  TranslatedRequest t;
  CHECK_FALSE(translate_request(json::parse(R"({"model":"tiny","input":"hi","reasoning":null,"stream":null,"store":null,"previous_response_id":null,"max_output_tokens":16,"temperature":0.5})"), nullptr, t).has_value());
  CHECK_FALSE(t.stream);
  CHECK(t.store);
  CHECK(t.chat["max_tokens"] == 16);
}

TEST_CASE("a function_call_output answers a call of the stored turn (previous_response_id's tool loop)") {
  // The stored turn: the user's request and the assistant's call, as ResponsesResponder stores them.
  const json previous = json::parse(R"([{"role":"user","content":"list the files"},
    {"role":"assistant","content":"","tool_calls":[{"id":"call_989d","type":"function","function":{"name":"Bash","arguments":"{\"command\":\"ls\"}"}}]}])");
  const json body = json::parse(R"({"model":"tiny","previous_response_id":"resp_1",
    "tools":[{"type":"function","name":"Bash","parameters":{"type":"object","properties":{}}}],
    "input":[{"type":"function_call_output","call_id":"call_989d","output":"a.txt"}]})");
  TranslatedRequest t;
  REQUIRE_FALSE(translate_request(body, &previous, t).has_value());
  CHECK(t.warnings.empty());
  const json& m = t.chat["messages"];
  REQUIRE(m.size() == 3);
  CHECK(m[1]["tool_calls"][0]["id"] == "call_989d");
  CHECK(m[2] == json{{"role", "tool"}, {"tool_call_id", "call_989d"}, {"content", "a.txt"}});
  // An output for a call no turn made is still dropped, and said.
  const json stray = json::parse(R"({"model":"tiny","previous_response_id":"resp_1","input":[{"type":"function_call_output","call_id":"call_x","output":"?"},{"role":"user","content":"go on"}]})");
  REQUIRE_FALSE(translate_request(stray, &previous, t).has_value());
  REQUIRE(t.warnings.size() == 1);
  CHECK(t.warnings[0] == "dropped function_call_output for unknown call_id 'call_x'");
}

TEST_CASE("a field inside an input item, a tool or text.format of the wrong type is named by its path, never read as empty") {
  const std::pair<const char*, const char*> cases[] = {
      {R"({"model":"tiny","input":[{"role":"user","content":"a"},{"type":5}]})", "field 'input.1.type' has the wrong type: expected a string, got number"},
      {R"({"model":"tiny","input":[{"role":5,"content":"hi"}]})", "field 'input.0.role' has the wrong type: expected a string, got number"},
      {R"({"model":"tiny","input":[{"role":"user","content":{"text":"hi"}}]})", "field 'input.0.content' has the wrong type: expected a string or an array of content parts, got object"},
      {R"({"model":"tiny","input":[{"role":"assistant","content":5}]})", "field 'input.0.content' has the wrong type: expected a string or an array of content parts, got number"},
      {R"({"model":"tiny","input":[{"role":"user","content":[{"type":"input_text","text":"a"},{"type":7}]}]})", "field 'input.0.content.1.type' has the wrong type: expected a string, got number"},
      {R"({"model":"tiny","input":[{"type":"function_call","call_id":"c","name":5,"arguments":"{}"}]})", "field 'input.0.name' has the wrong type: expected a string, got number"},
      {R"({"model":"tiny","input":[{"type":"function_call","call_id":"c","name":"f"},{"type":"function_call_output","call_id":"c","output":{"ok":true}}]})", "field 'input.1.output' has the wrong type: expected a string or an array of content parts, got object"},
      {R"({"model":"tiny","input":"hi","tools":[{"type":"function","name":"f"},{"type":5}]})", "field 'tools.1.type' has the wrong type: expected a string, got number"},
      {R"({"model":"tiny","input":"hi","tool_choice":{"type":"function","name":5}})", "field 'tool_choice.name' has the wrong type: expected a string, got number"},
      {R"({"model":"tiny","input":"hi","text":{"format":{"type":"json_schema","name":5}}})", "field 'text.format.name' has the wrong type: expected a string, got number"},
  };
  check_refusals(cases);
}

TEST_CASE("content parts without text (input_file, images in a tool output, nested arrays) are dropped with a warning, never silently") {
  TranslatedRequest t;
  auto err = translate_request(json::parse(R"({"model":"tiny","input":[
    {"role":"user","content":[{"type":"input_text","text":"read this"},{"type":"input_file","filename":"a.pdf","file_data":"data:application/pdf;base64,AA"}]},
    {"type":"function_call","call_id":"c","name":"shot","arguments":"{}"},
    {"type":"function_call_output","call_id":"c","output":[{"type":"input_text","text":"taken"},{"type":"input_image","image_url":"data:image/png;base64,AA"},[{"type":"input_text","text":"deep"}]]},
    {"type":"reasoning","summary":[],"encrypted_content":"gAAAAB"},
    {"role":"assistant","content":"ok"}]})"), nullptr, t);
  REQUIRE_FALSE(err.has_value());
  CHECK(t.chat["messages"][0]["content"] == "read this");
  CHECK(t.chat["messages"][2]["content"] == "taken");
  const std::vector<std::string> expected = {
      "dropped input.0.content.1 of type 'input_file' (no text the engine can read)",
      "dropped input.2.output.1 of type 'input_image' (no text the engine can read)",
      "dropped input.2.output.2 (a JSON array) (no text the engine can read)",
      "dropped input.3 (reasoning): only encrypted_content, which another provider wrote and no engine here can read"};
  CHECK(t.warnings == expected);
}
