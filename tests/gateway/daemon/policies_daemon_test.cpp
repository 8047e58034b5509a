// Every policy the registry can switch on (docs/policies.md), exercised through a real daemon:
// what the engine received (the fake engine's request log) and what the client got. A policy
// whose state the daemon never creates (the reasoning store of restore_reasoning) fails here.
#include <doctest/doctest.h>
#include <sys/stat.h>

#include "tests/gateway/daemon/daemon_rig.hpp"

using namespace sdtest::daemon;

namespace {

json fn_tool(const std::string& name, json properties, json required) {
  return {{"type", "function"},
          {"function",
           {{"name", name},
            {"parameters", {{"type", "object"}, {"properties", std::move(properties)}, {"required", std::move(required)}}}}}};
}

const json kTools = json::array({fn_tool("read_file", {{"path", {{"type", "string"}}}}, {"path"}),
                                 fn_tool("search", {{"query", {{"type", "string"}}}, {"max_results", {{"type", "integer"}}}},
                                         {"query"})});

/// The repairs counter of `policy` on model `model`, 0 when absent.
double repairs(Daemon& d, const std::string& policy, const std::string& model) {
  return d.metric("servedeck_policy_repairs_total{policy=\"" + policy + "\",model=\"" + model + "\"}").value_or(0);
}

/// Posts a non-streamed turn ending with the user message "script:NAME" (the engine answers
/// "ok"); returns the body the engine received.
json ask(Daemon& d, const std::string& name, const std::string& model, json history = json::array(),
         json extra = json::object()) {
  d.script(name, body_script({{"content", "ok"}}));
  history.push_back({{"role", "user"}, {"content", "script:" + name}});
  auto r = d.post("/v1/chat/completions", chat_body(model, history, false, extra));
  CAPTURE(r.body);
  REQUIRE(r.status == 200);
  CHECK(json::parse(r.body)["model"] == model);  // every answer echoes the id the client sent
  json e = d.engine_request(name);
  REQUIRE(e.is_object());
  return e;
}

}  // namespace

TEST_CASE("daemon: every request-side policy reaches the engine's body") {
  const std::string config =
      "presets = [{ alias = \"a-low\", chat_template_kwargs = { reasoning_effort = \"low\" }, thinking_token_budget = 1000 }]\n"
      "[models.a.policies]\n"
      "min_output_tokens = 8192\n"
      "accepted_reasoning_efforts = [\"low\", \"high\", \"max\"]\n"
      "unsupported_kwargs = [\"enable_thinking\"]\n"
      "thinking_token_budget = true\n"
      "flatten_content = true\n"
      "sanitize_tool_tags = true\n"
      "[models.a.policies.extra]\n"
      "request_cleanup = { drop_top_level = [\"parallel_tool_calls\"] }\n";
  Daemon d({fake_model("a", config), "a"});

  // Effort preset alias, min_output_tokens and the preset's thinking budget (min(1000, 75% of 8192)).
  json e = ask(d, "preset", "a-low", json::array(), {{"max_tokens", 200}});
  CHECK(e["model"] == "a-served");
  CHECK(e["chat_template_kwargs"]["reasoning_effort"] == "low");
  CHECK(e["max_tokens"] == 8192);
  CHECK(e["thinking_token_budget"] == 1000);

  // reasoning_effort mapped onto the accepted values (medium → high), moved into the kwargs.
  e = ask(d, "effort", "a-served", json::array(), {{"reasoning_effort", "medium"}});
  CHECK(e["chat_template_kwargs"]["reasoning_effort"] == "high");
  CHECK_FALSE(e.contains("reasoning_effort"));

  // unsupported_kwargs (G16): enable_thinking=false becomes the lowest accepted effort.
  e = ask(d, "kwargs", "a-served", json::array(), {{"chat_template_kwargs", {{"enable_thinking", false}}}});
  CHECK_FALSE(e["chat_template_kwargs"].contains("enable_thinking"));
  CHECK(e["chat_template_kwargs"]["reasoning_effort"] == "low");

  // The echoed history: flatten_content, reasoning dialects (G20), sanitize_tool_tags (G02),
  // and request_cleanup's drop_top_level.
  json history = json::array(
      {{{"role", "system"}, {"content", json::array({{{"type", "text"}, {"text", "be brief"}}, {{"type", "text"}, {"text", "be right"}}})}},
       {{"role", "user"}, {"content", "read /x"}},
       {{"role", "assistant"},
        {"content", ""},
        {"reasoning", "I will read /x."},
        {"tool_calls",
         json::array({{{"id", "call_1"},
                       {"type", "function"},
                       {"function", {{"name", "read_file"}, {"arguments", "{\"path</arg_key>\": \"/x\"}"}}}}})}},
       {{"role", "tool"},
        {"tool_call_id", "call_1"},
        {"content", json::array({{{"type", "text"}, {"text", "line 1"}}, {{"type", "text"}, {"text", "line 2"}}})}}});
  e = ask(d, "history", "a-served", history, {{"tools", kTools}, {"parallel_tool_calls", true}});
  const auto& m = e["messages"];
  REQUIRE(m.size() == 5);
  CHECK(m[0]["content"] == "be brief\nbe right");
  CHECK(m[2]["reasoning_content"] == "I will read /x.");
  CHECK_FALSE(m[2].contains("reasoning"));
  CHECK(json::parse(m[2]["tool_calls"][0]["function"]["arguments"].get<std::string>()) == json{{"path", "/x"}});
  CHECK(m[3]["content"] == "line 1\nline 2");
  CHECK_FALSE(e.contains("parallel_tool_calls"));

  for (const char* p : {"effort_presets", "min_output_tokens", "unsupported_kwargs", "flatten_content", "reasoning_dialects",
                        "sanitize_tool_tags", "request_cleanup"}) {
    CAPTURE(p);
    CHECK(repairs(d, p, "a") >= 1);
  }
}

TEST_CASE("daemon: restore_reasoning puts a streamed turn's reasoning back on the next request") {
  Daemon d({fake_model("r", "[models.r.policies]\nrestore_reasoning = true\nsanitize_tool_tags = true\n"), "r"});
  // Turn 1: reasoning, then a tool call whose key carries leaked markup (G02).
  d.script("turn1", stream_script({reasoning_chunk("I should read "), reasoning_chunk("/tmp/x first."),
                                   tool_chunk("{\"path</arg", "read_file", "call_rr1"), tool_chunk("_key>\": \"/tmp/x\"}")},
                                  "tool_calls"));
  json history = json::array({{{"role", "user"}, {"content", "script:turn1"}}});
  auto r1 = d.stream(chat_body("r-served", history, true, {{"tools", kTools}}));
  CAPTURE(r1.raw);
  REQUIRE(r1.status == 200);
  CHECK(r1.delta_text("reasoning_content") == "I should read /tmp/x first.");
  auto calls = r1.tool_calls();
  REQUIRE(calls.size() == 1);
  CHECK(calls[0]["id"] == "call_rr1");
  CHECK(calls[0]["name"] == "read_file");
  CHECK(json::parse(calls[0]["arguments"].get<std::string>()) == json{{"path", "/tmp/x"}});
  CHECK(r1.finish_reason() == "tool_calls");

  // Turn 2: the client echoes the call without its reasoning (as every OpenAI client does).
  history.push_back({{"role", "assistant"},
                     {"content", nullptr},
                     {"tool_calls", json::array({{{"id", calls[0]["id"]},
                                                  {"type", "function"},
                                                  {"function", {{"name", calls[0]["name"]}, {"arguments", calls[0]["arguments"]}}}}})}});
  history.push_back({{"role", "tool"}, {"tool_call_id", "call_rr1"}, {"content", "hello"}});
  d.script("turn2", stream_script({content_chunk("It says hello.")}));
  history.push_back({{"role", "user"}, {"content", "script:turn2"}});
  auto r2 = d.stream(chat_body("r-served", history, true, {{"tools", kTools}}));
  CHECK(r2.delta_text() == "It says hello.");
  json e = d.engine_request("turn2");
  REQUIRE(e.is_object());
  CAPTURE(e.dump());
  CHECK(e["messages"][1]["reasoning_content"] == "I should read /tmp/x first.");
  CHECK(repairs(d, "restore_reasoning", "r") == 1);
  CHECK(repairs(d, "sanitize_tool_tags", "r") >= 1);

  // A non-streamed turn is remembered too, by its content.
  d.script("body1", body_script({{"content", "The answer is 4."}, {"reasoning_content", "2 + 2 = 4."}}));
  json h = json::array({{{"role", "user"}, {"content", "script:body1"}}});
  auto b1 = d.post("/v1/chat/completions", chat_body("r-served", h, false));
  REQUIRE(b1.status == 200);
  h.push_back({{"role", "assistant"}, {"content", "The answer is 4."}});
  e = ask(d, "body2", "r-served", h);
  CHECK(e["messages"][1]["reasoning_content"] == "2 + 2 = 4.");
}

TEST_CASE("daemon: the response-side policies repair streams (tool calls, mirror_content, answer_rescue, capture)") {
  const std::string config =
      "[models.s.policies]\nsanitize_tool_tags = true\ncoerce_tool_argument_types = true\nmirror_content = true\n"
      "answer_rescue = true\ncapture = true\n";
  Daemon d({fake_model("s", config), "s", "", {{"SERVEDECK_CAPTURE", "1"}, {"SERVEDECK_CAPTURE_DIR", ""}}});
  auto turn = [&](const std::string& name, const json& script) {
    d.script(name, script);
    auto r = d.stream(chat_body("s-served", script_messages(name), true, {{"tools", kTools}}));
    CAPTURE(name);
    CAPTURE(r.raw);
    CHECK(r.status == 200);
    CHECK(r.done());
    return r;
  };

  // G07 (coerce_tool_argument_types): "10" for an integer parameter becomes 10.
  auto g07 = turn("g07", stream_script({tool_chunk("{\"query\": \"x\", ", "search", "call_s1"), tool_chunk("\"max_results\": \"10\"}")},
                                       "tool_calls"));
  REQUIRE(g07.tool_calls().size() == 1);
  CHECK(json::parse(g07.tool_calls()[0]["arguments"].get<std::string>()) == json{{"query", "x"}, {"max_results", 10}});

  // G05 (tool_call_repair): finish tool_calls with the call written as text.
  auto g05 = turn("g05", stream_script({content_chunk("Reading. <tool_call>{\"name\": \"read_file\", "),
                                        content_chunk("\"arguments\": {\"path\": \"/b\"}}</tool_call>")},
                                       "tool_calls"));
  REQUIRE(g05.tool_calls().size() == 1);
  CHECK(g05.tool_calls()[0]["name"] == "read_file");
  CHECK(json::parse(g05.tool_calls()[0]["arguments"].get<std::string>()) == json{{"path", "/b"}});
  CHECK(g05.finish_reason() == "tool_calls");
  CHECK_FALSE(sdtest::contains(g05.delta_text(), "<tool_call>"));

  // mirror_content: reasoning under both names.
  auto mirror = turn("mirror", stream_script({reasoning_chunk("Think."), content_chunk("Done.")}));
  CHECK(mirror.delta_text("reasoning") == "Think.");
  CHECK(mirror.delta_text("reasoning_content") == "Think.");

  // answer_rescue: reasoning that is the answer becomes content at the end.
  auto rescued = turn("rescue", stream_script({reasoning_chunk("The answer is 42.")}));
  CHECK(rescued.delta_text() == "The answer is 42.");

  // answer_rescue streams a plain answer as it arrives: the first words reach the client long
  // before the engine's last ones (6 pieces, 400 ms apart).
  std::vector<json> words;
  for (int i = 0; i < 6; ++i) words.push_back(content_chunk("word" + std::to_string(i) + " "));
  auto live = turn("live", stream_script(words, "stop", 400));
  CHECK(live.delta_text() == "word0 word1 word2 word3 word4 word5 ");
  double first_content_ms = -1;
  for (std::size_t i = 0; i < live.data.size() && first_content_ms < 0; ++i) {
    auto j = json::parse(live.data[i], nullptr, false);
    if (j.is_object() && j.contains("choices") && !j["choices"].empty() &&
        j["choices"][0]["delta"].value("content", std::string()).size() > 0)
      first_content_ms = live.data_ms[i];
  }
  CAPTURE(first_content_ms);
  CAPTURE(live.total_ms);
  CHECK(first_content_ms >= 0);
  CHECK(first_content_ms < live.total_ms - 1500);

  for (const char* p : {"tool_call_repair", "answer_rescue"}) {
    CAPTURE(p);
    CHECK(repairs(d, p, "s") >= 1);
  }

  // capture (the policy and SERVEDECK_CAPTURE=1): one 0600 file per exchange in state/capture.
  const std::string cap = d.dir() + "/state/capture";
  REQUIRE(sdtest::wait_for([&] {
    std::error_code ec;
    return fs::exists(cap, ec) && std::distance(fs::directory_iterator(cap), fs::directory_iterator()) >= 5;
  }, 5000));
  for (const auto& f : fs::directory_iterator(cap)) {
    struct stat st {};
    REQUIRE(::stat(f.path().c_str(), &st) == 0);
    CHECK((st.st_mode & 0777) == 0600);
  }
}
