// Response-side policies on recorded bodies and streams: sanitize_tool_tags (whole and streamed,
// tag split across chunk boundaries at every offset), G03/G04/G05/G07, G16, G20, answer rescue,
// mirror_content, model echo.
#include <doctest/doctest.h>

#include "common/stream_limits.hpp"
#include "policies/pipeline.hpp"
#include "policy_test_support.hpp"

using namespace servedeck;
using namespace servedeck::policies;
using namespace servedeck::policies::testing;

namespace {

json tools_request(json tools) { return {{"messages", json::array()}, {"tools", std::move(tools)}}; }

json fn(const std::string& name, json properties, json required = json::array()) {
  return {{"type", "function"},
          {"function", {{"name", name}, {"parameters", {{"type", "object"}, {"properties", properties}, {"required", required}}}}}};
}

json body_with(json message, const std::string& finish) {
  message["role"] = "assistant";
  return {{"id", "chatcmpl-x"}, {"object", "chat.completion"}, {"model", "glm53-flash"},
          {"choices", json::array({{{"index", 0}, {"message", message}, {"finish_reason", finish}}})}};
}

json call(const std::string& name, const std::string& args, const std::string& id = "call_1") {
  return {{"id", id}, {"type", "function"}, {"function", {{"name", name}, {"arguments", args}}}};
}

struct Resp {
  registry::ModelEntry model = glm_entry();
  Counter counter;
  ReasoningStore* store = nullptr;
  ResponseContext ctx(json request, const std::string& requested = "glm53-flash") {
    return ResponseContext{&model, requested, std::move(request), counter.fn(), store};
  }
};

const json kSearchTools = json::array({fn("search", {{"query", {{"type", "string"}}}, {"max_results", {{"type", "integer"}}}}, {"query"})});

}  // namespace

TEST_CASE("seed capture, non-streamed: the leaked </arg_key> is stripped; model echoes the alias") {
  Resp r;
  auto ctx = r.ctx(fixture("list_dir_request.json"), "glm53-flash-high");
  ResponsePipeline p(ctx);
  json body = fixture("list_dir_leak.json");
  REQUIRE_FALSE(p.apply_body(body).has_value());
  CHECK(body["model"] == "glm53-flash-high");
  const auto& tc = body["choices"][0]["message"]["tool_calls"][0];
  CHECK(tc["function"]["arguments"] == "{\"path\": \"/Users/user/Desktop/project\"}");
  CHECK(json::parse(tc["function"]["arguments"].get<std::string>()) == json{{"path", "/Users/user/Desktop/project"}});
  CHECK(r.counter["sanitize_tool_tags"] == 1);
}

TEST_CASE("seed capture, streamed: same arguments as non-streamed; alias in every chunk") {
  Resp r;
  auto ctx = r.ctx(fixture("list_dir_request.json"), "glm53-flash-high");
  auto out = run_stream(ctx, sse_chunks("list_dir_leak.sse"));
  auto a = assemble(out);
  CHECK(a.calls[0]["arguments"] == "{\"path\": \"/Users/user/Desktop/project\"}");
  CHECK(a.calls[0]["name"] == "list_dir");
  CHECK(a.calls[0]["id"] == "chatcmpl-tool-5d3b8e2a");
  CHECK(a.finish_reason == "tool_calls");
  CHECK(a.finish_chunks == 1);
  CHECK(a.reasoning_content == "The user wants the project directory listed. I'll call list_dir on the project root.");
  for (const auto& m : a.models) CHECK(m == "glm53-flash-high");
  CHECK(out.back().contains("usage"));  // the usage chunk passes through
  for (const auto& f : a.arg_fragments) CHECK(f.find("</arg") == std::string::npos);
}

TEST_CASE("streamed arguments split across chunk boundaries at EVERY offset equal the non-streamed result") {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"{\"path</arg_key>\": \"/Users/user/Desktop/project\"}", "{\"path\": \"/Users/user/Desktop/project\"}"},
      {"{\"path\": \"<arg_value>/tmp/x</arg_value>\"}", "{\"path\": \"/tmp/x\"}"},
      {"{\"filePath</arg_key>\": \"/a\", \"startLine\": 3}", "{\"filePath\": \"/a\", \"startLine\": 3}"},
  };
  json request = fixture("list_dir_request.json");
  for (const auto& [raw, expected] : cases) {
    std::string name = raw.find("filePath") != std::string::npos ? "read_file" : "list_dir";
    Resp whole_r;
    auto wctx = whole_r.ctx(request);
    ResponsePipeline wp(wctx);
    json body = body_with({{"content", nullptr}, {"tool_calls", json::array({call(name, raw)})}}, "tool_calls");
    REQUIRE_FALSE(wp.apply_body(body).has_value());
    const std::string whole = body["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"];
    CHECK(whole == expected);
    for (std::size_t cut1 = 0; cut1 <= raw.size(); ++cut1) {
      for (std::size_t cut2 = cut1; cut2 <= raw.size(); cut2 += 7) {
        CAPTURE(raw);
        CAPTURE(cut1);
        CAPTURE(cut2);
        Resp r;
        auto ctx = r.ctx(request);
        std::vector<json> in = {chunk({{"role", "assistant"}}),
                                args_chunk(raw.substr(0, cut1), name, "call_9"),
                                args_chunk(raw.substr(cut1, cut2 - cut1)),
                                args_chunk(raw.substr(cut2)),
                                chunk(json::object(), "tool_calls")};
        auto a = assemble(run_stream(ctx, in));
        CHECK(a.calls[0]["arguments"] == whole);
        std::string acc;
        for (const auto& f : a.arg_fragments) {
          acc += f;
          CHECK(whole.compare(0, acc.size(), acc) == 0);  // every fragment extends a prefix of the result
        }
        CHECK(a.finish_reason == "tool_calls");
      }
    }
  }
}

TEST_CASE("G02: a corrupted call that does not map onto the schema is never forwarded") {
  json request = tools_request(json::array({fn("read", {{"file", {{"type", "string"}}}, {"page", {{"type", "integer"}}}})}));
  Resp r;
  auto ctx = r.ctx(request);
  ResponsePipeline p(ctx);
  json body = body_with({{"tool_calls", json::array({call("read", "{\"file<arg_key\": \"page</arg_key><arg_value>5\"}")})}}, "tool_calls");
  REQUIRE_FALSE(p.apply_body(body).has_value());
  CHECK(body["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"] == "{\"page\":5}");

  json bad = body_with({{"tool_calls", json::array({call("read", "{\"file<arg_key\": \"size</arg_key><arg_value>5\"}")})}}, "tool_calls");
  auto err = p.apply_body(bad);
  REQUIRE(err.has_value());
  CHECK(err->code == "tool_call_unrecoverable");

  Resp s;
  auto sctx = s.ctx(request);
  std::optional<PolicyError> serr;
  auto out = run_stream(sctx, {args_chunk("{\"file<arg_", "read", "c1"), args_chunk("key\": \"size</arg_key><arg_value>5\"}"),
                               chunk(json::object(), "tool_calls")}, &serr);
  REQUIRE(serr.has_value());
  CHECK(serr->code == "tool_call_unrecoverable");
  auto a = assemble(out);
  CHECK(a.finish_chunks == 0);
  for (const auto& f : a.arg_fragments) {
    CHECK(f.find("size") == std::string::npos);
    CHECK(f.find("file") == std::string::npos);
  }
}

TEST_CASE("G03: {} for a tool with required parameters is recovered from raw text, else an error") {
  Resp r;
  auto ctx = r.ctx(tools_request(kSearchTools));
  ResponsePipeline p(ctx);
  json body = body_with({{"content", "<tool_call>search<arg_key>query</arg_key>servedeck policies</arg_value></tool_call>"},
                         {"tool_calls", json::array({call("search", "{}")})}}, "tool_calls");
  REQUIRE_FALSE(p.apply_body(body).has_value());
  const auto& msg = body["choices"][0]["message"];
  CHECK(json::parse(msg["tool_calls"][0]["function"]["arguments"].get<std::string>()) == json{{"query", "servedeck policies"}});
  CHECK(msg["content"] == "");
  CHECK(r.counter["tool_call_repair"] == 1);

  json none = body_with({{"content", nullptr}, {"tool_calls", json::array({call("search", "{}")})}}, "tool_calls");
  auto err = p.apply_body(none);
  REQUIRE(err.has_value());
  CHECK(err->code == "tool_call_unrecoverable");
  CHECK(err->message.find("query") != std::string::npos);

  // streamed: "{}" is held, never emitted; recovered from raw markup seen in the content
  Resp s;
  auto sctx = s.ctx(tools_request(kSearchTools));
  std::optional<PolicyError> serr;
  auto out = run_stream(sctx, {chunk({{"content", "search<arg_key>query</arg_key>foo</arg_value>"}}),
                               args_chunk("{", "search", "c1"), args_chunk("}"), chunk(json::object(), "tool_calls")}, &serr);
  REQUIRE_FALSE(serr.has_value());
  auto a = assemble(out);
  CHECK(json::parse(a.calls[0]["arguments"].get<std::string>()) == json{{"query", "foo"}});
  for (const auto& f : a.arg_fragments) CHECK(f != "{");

  Resp s2;
  auto sctx2 = s2.ctx(tools_request(kSearchTools));
  out = run_stream(sctx2, {args_chunk("{", "search", "c1"), args_chunk("}"), chunk(json::object(), "tool_calls")}, &serr);
  REQUIRE(serr.has_value());
  CHECK(assemble(out).calls.empty());
}

TEST_CASE("G04: a name glued to a parameter is split; an undeclared name is never emitted") {
  json request = tools_request(json::array({fn("send_command_to_shell", {{"command", {{"type", "string"}}}}, {"command"}),
                                            fn("grep_tool", {{"pattern", {{"type", "string"}}}}, {"pattern"})}));
  Resp r;
  auto ctx = r.ctx(request);
  ResponsePipeline p(ctx);
  json body = body_with({{"tool_calls", json::array({call("send_command_to_shellcommand", "ls -la")})}}, "tool_calls");
  REQUIRE_FALSE(p.apply_body(body).has_value());
  const auto& f = body["choices"][0]["message"]["tool_calls"][0]["function"];
  CHECK(f["name"] == "send_command_to_shell");
  CHECK(json::parse(f["arguments"].get<std::string>()) == json{{"command", "ls -la"}});

  // streamed, the name itself split across chunks
  Resp s;
  auto sctx = s.ctx(request);
  std::vector<json> in = {chunk({{"tool_calls", json::array({{{"index", 0}, {"id", "c1"}, {"type", "function"}, {"function", {{"name", "send_command_to"}}}}})}}),
                          chunk({{"tool_calls", json::array({{{"index", 0}, {"function", {{"name", "_shellcommand"}}}}})}}),
                          args_chunk("{\"command\": \"ls\"}"), chunk(json::object(), "tool_calls")};
  auto a = assemble(run_stream(sctx, in));
  REQUIRE(a.names_seen.size() == 1);
  CHECK(a.names_seen[0] == "send_command_to_shell");
  CHECK(a.calls[0]["arguments"] == "{\"command\": \"ls\"}");

  Resp u;
  auto uctx = u.ctx(request);
  std::optional<PolicyError> err;
  StreamPipeline sp(uctx);
  auto first = sp.on_chunk(args_chunk("{\"x\":1}", "rm_everything", "c1"));
  CHECK(assemble(first).names_seen.empty());
  REQUIRE(sp.error().has_value());
  CHECK(sp.error()->code == "tool_call_unknown_name");
  CHECK(sp.on_chunk(chunk(json::object(), "tool_calls")).empty());  // finish withheld
  sp.finish(err);
  CHECK(err.has_value());
}

TEST_CASE("G05: finish tool_calls without any tool call: recovered from raw text, or an error") {
  json request = tools_request(json::array({fn("get_time", json::object())}));
  Resp r;
  auto ctx = r.ctx(request);
  std::optional<PolicyError> err;
  // the raw block split across content chunks at every offset
  std::string raw = "<tool_call>get_time</tool_call>";
  for (std::size_t cut = 0; cut <= raw.size(); ++cut) {
    CAPTURE(cut);
    auto out = run_stream(ctx, {chunk({{"content", raw.substr(0, cut)}}), chunk({{"content", raw.substr(cut)}}),
                                chunk(json::object(), "tool_calls")}, &err);
    REQUIRE_FALSE(err.has_value());
    auto a = assemble(out);
    CHECK(a.content.empty());
    REQUIRE(a.calls.count(0) == 1);
    CHECK(a.calls[0]["name"] == "get_time");
    CHECK(a.calls[0]["arguments"] == "{}");
    CHECK(a.calls[0]["id"].get<std::string>().rfind("call_", 0) == 0);
    CHECK(a.finish_reason == "tool_calls");
  }
  auto out = run_stream(ctx, {chunk({{"content", ""}}), chunk(json::object(), "tool_calls")}, &err);
  REQUIRE(err.has_value());
  CHECK(err->code == "tool_call_missing");
  CHECK(assemble(out).finish_chunks == 0);

  ResponsePipeline p(ctx);
  json body = body_with({{"content", nullptr}}, "tool_calls");
  auto e = p.apply_body(body);
  REQUIRE(e.has_value());
  CHECK(e->code == "tool_call_missing");
}

TEST_CASE("G07: streamed {\"max_results\":\"10\"} is coerced to 10; argument deltas are buffered") {
  Resp r;
  r.model.policies.coerce_tool_argument_types = true;
  auto ctx = r.ctx(tools_request(kSearchTools));
  std::vector<json> in = {args_chunk("{\"query\":\"x\",", "search", "c1"), args_chunk("\"max_results\":\"1"),
                          args_chunk("0\"}"), chunk(json::object(), "tool_calls")};
  StreamPipeline p(ctx);
  for (std::size_t i = 0; i + 1 < in.size(); ++i) CHECK(assemble(p.on_chunk(in[i])).arg_fragments.empty());
  auto tail = p.on_chunk(in.back());
  std::optional<PolicyError> err;
  p.finish(err);
  auto a = assemble(tail);
  CHECK(json::parse(a.calls[0]["arguments"].get<std::string>()) == json{{"query", "x"}, {"max_results", 10}});
  CHECK(a.calls[0]["name"] == "search");
  CHECK(r.counter["tool_call_repair"] == 1);

  ResponsePipeline np(ctx);
  json body = body_with({{"tool_calls", json::array({call("search", "{\"query\":\"x\",\"max_results\":\"10\"}")})}}, "tool_calls");
  REQUIRE_FALSE(np.apply_body(body).has_value());
  CHECK(body["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"] == a.calls[0]["arguments"]);
}

TEST_CASE("G16: a stray closing think tag in content splits there (body and stream)") {
  Resp r;
  r.model.policies.answer_rescue = true;
  auto ctx = r.ctx(json::object());
  ResponsePipeline p(ctx);
  json body = fixture("g16_stray_think.json");
  REQUIRE_FALSE(p.apply_body(body).has_value());
  const auto& msg = body["choices"][0]["message"];
  CHECK(msg["content"] == "FINAL: B");
  CHECK(msg["reasoning_content"] == "Option A costs 3, option B costs 2, so B is cheaper.");

  // Streamed, the text before the tag was already passed on as content: the tag is cut out and
  // the answer follows a blank line, wherever the chunk boundary falls.
  std::string content = "Option A costs 3, option B costs 2, so B is cheaper.</think> FINAL: B";
  for (std::size_t cut = 0; cut <= content.size(); ++cut) {
    CAPTURE(cut);
    Resp s;
    s.model.policies.answer_rescue = true;
    auto sctx = s.ctx(json::object());
    auto a = assemble(run_stream(sctx, {chunk({{"role", "assistant"}}), chunk({{"content", content.substr(0, cut)}}),
                                        chunk({{"content", content.substr(cut)}}), chunk(json::object(), "stop")}));
    CHECK(a.content == "Option A costs 3, option B costs 2, so B is cheaper.\n\nFINAL: B");
    CHECK(a.reasoning_content.empty());
    CHECK(s.counter["answer_rescue"] == 1);
  }
}

TEST_CASE("answer_rescue streams a plain answer as it arrives; only a possible tag start waits") {
  Resp r;
  r.model.policies.answer_rescue = true;
  auto ctx = r.ctx(json::object());
  StreamPipeline p(ctx);
  auto content_of = [](const std::vector<json>& out) {
    std::string c;
    for (const auto& o : out) c += assemble({o}).content;
    return c;
  };
  // Each delta is passed on by the chunk that brought it (no reasoning ever arrives).
  CHECK(content_of(p.on_chunk(chunk({{"role", "assistant"}, {"content", ""}}))).empty());
  CHECK(content_of(p.on_chunk(chunk({{"content", "The answer "}}))) == "The answer ");
  CHECK(content_of(p.on_chunk(chunk({{"content", "is 42 <"}}))) == "is 42 ");  // "<" may begin </think>
  CHECK(content_of(p.on_chunk(chunk({{"content", "b>bold</b>"}}))) == "<b>bold</b>");
  CHECK(content_of(p.on_chunk(chunk({{"content", std::string(20000, 'x')}}))) == std::string(20000, 'x'));
  auto end = p.on_chunk(chunk(json::object(), "stop"));
  CHECK(content_of(end).empty());
  std::optional<PolicyError> err;
  CHECK(p.finish(err).empty());
  CHECK_FALSE(err.has_value());
  CHECK(r.counter["answer_rescue"] == 0);
}

TEST_CASE("G20: delta.reasoning and delta.reasoning_content both accepted; reasoning-only chunks kept") {
  Resp r;
  auto ctx = r.ctx(json::object());
  auto in = sse_chunks("g20_reasoning.sse");
  auto out = run_stream(ctx, in);
  auto a = assemble(out);
  CHECK(a.reasoning == "Compare A and B.\nB is larger. Answer: B.");
  CHECK(a.content == "FINAL: B");
  std::size_t reasoning_only = 0;
  for (const auto& c : out) {
    const auto& d = c["choices"][0]["delta"];
    if (d.contains("reasoning") && !d.contains("content")) ++reasoning_only;
  }
  CHECK(reasoning_only == 3);

  Resp m;
  m.model.policies.mirror_content = true;
  auto mctx = m.ctx(json::object());
  auto mirrored = assemble(run_stream(mctx, in));
  CHECK(mirrored.reasoning == "Compare A and B.\nB is larger. Answer: B.");
  CHECK(mirrored.reasoning_content == mirrored.reasoning);
  auto other = assemble(run_stream(mctx, sse_chunks("list_dir_leak.sse")));
  CHECK(other.reasoning == other.reasoning_content);
  CHECK_FALSE(other.reasoning.empty());

  ResponsePipeline p(mctx);
  json body = fixture("list_dir_leak.json");
  REQUIRE_FALSE(p.apply_body(body).has_value());
  CHECK(body["choices"][0]["message"]["reasoning"] == body["choices"][0]["message"]["reasoning_content"]);
}

TEST_CASE("answer rescue: reasoning that is the answer moves to content; never for finish length") {
  Resp r;
  r.model.policies.answer_rescue = true;
  auto ctx = r.ctx(json::object());
  ResponsePipeline p(ctx);
  json body = body_with({{"content", ""}, {"reasoning_content", "The answer is 42."}}, "stop");
  REQUIRE_FALSE(p.apply_body(body).has_value());
  CHECK(body["choices"][0]["message"]["content"] == "The answer is 42.");
  CHECK_FALSE(body["choices"][0]["message"].contains("reasoning_content"));
  CHECK(r.counter["answer_rescue"] == 1);

  // seed: max_tokens=200 → finish "length", content empty: a budget problem, not rescued
  json length = fixture("empty_turn_length.json");
  json before = length;
  REQUIRE_FALSE(p.apply_body(length).has_value());
  CHECK(length["choices"][0]["message"]["content"] == "");
  CHECK(length["choices"][0]["message"]["reasoning_content"] == before["choices"][0]["message"]["reasoning_content"]);

  // a closing think tag was seen: the model finished thinking and chose no answer
  json closed = body_with({{"content", ""}, {"reasoning_content", "done thinking</think>"}}, "stop");
  REQUIRE_FALSE(p.apply_body(closed).has_value());
  CHECK(closed["choices"][0]["message"]["content"] == "");

  // streamed: the content delta comes before the finish chunk
  auto out = run_stream(ctx, {chunk({{"reasoning_content", "The answer"}}), chunk({{"reasoning_content", " is 42."}}),
                              chunk(json::object(), "stop")});
  REQUIRE(out.size() >= 2);
  CHECK(out[out.size() - 2]["choices"][0]["delta"]["content"] == "The answer is 42.");
  CHECK(out.back()["choices"][0]["finish_reason"] == "stop");
  auto len = assemble(run_stream(ctx, {chunk({{"reasoning_content", "thinking"}}), chunk(json::object(), "length")}));
  CHECK(len.content.empty());
}

TEST_CASE("answer rescue: a complete tool_call block in content or reasoning becomes a tool call") {
  json request = tools_request(json::array({fn("read_file", {{"filePath", {{"type", "string"}}}, {"startLine", {{"type", "integer"}}}}, {"filePath"})}));
  Resp r;
  r.model.policies.answer_rescue = true;
  auto ctx = r.ctx(request);
  ResponsePipeline p(ctx);
  json body = body_with({{"content", "Reading it now.\n<tool_call>read_file\n<arg_key>filePath</arg_key>\n<arg_value>/a.py</arg_value>\n"
                                     "<arg_key>startLine</arg_key>\n<arg_value>10</arg_value>\n</tool_call>"}}, "stop");
  REQUIRE_FALSE(p.apply_body(body).has_value());
  const auto& msg = body["choices"][0]["message"];
  CHECK(body["choices"][0]["finish_reason"] == "tool_calls");
  CHECK(msg["content"] == "Reading it now.");
  CHECK(json::parse(msg["tool_calls"][0]["function"]["arguments"].get<std::string>()) == json{{"filePath", "/a.py"}, {"startLine", 10}});

  json hermes = body_with({{"content", ""}, {"reasoning_content", "I will read it. <tool_call>{\"name\": \"read_file\", \"arguments\": {\"filePath\": \"/b\"}}</tool_call>"}}, "stop");
  REQUIRE_FALSE(p.apply_body(hermes).has_value());
  CHECK(hermes["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "read_file");

  // a block naming an undeclared tool stays text
  json other = body_with({{"content", "<tool_call>rm<arg_key>p</arg_key><arg_value>/</arg_value></tool_call>"}}, "stop");
  REQUIRE_FALSE(p.apply_body(other).has_value());
  CHECK_FALSE(other["choices"][0]["message"].contains("tool_calls"));

  // streamed, the block split at every offset: no markup leaks into content
  std::string text = "Reading.<tool_call>read_file<arg_key>filePath</arg_key><arg_value>/a.py</arg_value></tool_call>";
  for (std::size_t cut = 0; cut <= text.size(); ++cut) {
    CAPTURE(cut);
    Resp s;
    s.model.policies.answer_rescue = true;
    auto sctx = s.ctx(request);
    auto a = assemble(run_stream(sctx, {chunk({{"reasoning_content", "plan"}}), chunk({{"content", text.substr(0, cut)}}),
                                        chunk({{"content", text.substr(cut)}}), chunk(json::object(), "stop")}));
    CHECK(a.content == "Reading.");
    CHECK(a.finish_reason == "tool_calls");
    REQUIRE(a.calls.count(0) == 1);
    CHECK(json::parse(a.calls[0]["arguments"].get<std::string>()) == json{{"filePath", "/a.py"}});
  }
}

TEST_CASE("answer rescue: Qwen3-Coder XML markup leaked into content becomes a tool call, streamed at every split") {
  json request = tools_request(json::array({fn("read_file", {{"filePath", {{"type", "string"}}}, {"startLine", {{"type", "integer"}}}}, {"filePath"})}));
  const std::string text =
      "Reading.\n<tool_call>\n<function=read_file>\n<parameter=filePath>\n/a.py\n</parameter>\n<parameter=startLine>\n10\n"
      "</parameter>\n</function>\n</tool_call>";
  Resp r;
  r.model.policies.answer_rescue = true;
  auto ctx = r.ctx(request);
  ResponsePipeline p(ctx);
  json body = body_with({{"content", text}}, "stop");
  REQUIRE_FALSE(p.apply_body(body).has_value());
  CHECK(body["choices"][0]["finish_reason"] == "tool_calls");
  CHECK(body["choices"][0]["message"]["content"] == "Reading.");
  CHECK(json::parse(body["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"].get<std::string>()) ==
        json{{"filePath", "/a.py"}, {"startLine", 10}});
  for (std::size_t cut = 0; cut <= text.size(); ++cut) {
    CAPTURE(cut);
    Resp s;
    s.model.policies.answer_rescue = true;
    auto sctx = s.ctx(request);
    auto a = assemble(run_stream(sctx, {chunk({{"content", text.substr(0, cut)}}), chunk({{"content", text.substr(cut)}}),
                                        chunk(json::object(), "stop")}));
    CHECK(a.content == "Reading.\n");
    CHECK(a.finish_reason == "tool_calls");
    REQUIRE(a.calls.count(0) == 1);
    CHECK(json::parse(a.calls[0]["arguments"].get<std::string>()) == json{{"filePath", "/a.py"}, {"startLine", 10}});
  }
}

TEST_CASE("policies off: a response passes through unchanged apart from the echoed model") {
  Resp r;
  r.model.policies = registry::PolicyConfig{};
  auto ctx = r.ctx(fixture("list_dir_request.json"));
  ResponsePipeline p(ctx);
  json body = fixture("list_dir_leak.json");
  json before = body;
  REQUIRE_FALSE(p.apply_body(body).has_value());
  CHECK(body == before);
  auto in = sse_chunks("list_dir_leak.sse");
  auto out = run_stream(ctx, in);
  auto a = assemble(out);
  CHECK(a.calls[0]["arguments"] == "{\"path</arg_key>\": \"/Users/user/Desktop/project\"}");
  CHECK(r.counter.counts.empty());
}

TEST_CASE("a fragment for a tool call that already ended fails the stream (never dropped)") {
  // Call 0 ends when call 1 starts (its repaired arguments are sent whole); a later fragment of
  // call 0 can be neither added nor dropped.
  Resp r;
  auto ctx = r.ctx(tools_request(kSearchTools));
  StreamPipeline p(ctx);
  json second = args_chunk("{\"query\":\"b\"}", "search", "c2");
  second["choices"][0]["delta"]["tool_calls"][0]["index"] = 1;
  (void)p.on_chunk(args_chunk("{\"query\":\"a", "search", "c1"));
  (void)p.on_chunk(second);
  CHECK_FALSE(p.error().has_value());
  (void)p.on_chunk(args_chunk("\"}"));
  REQUIRE(p.error().has_value());
  CHECK(p.error()->code == "tool_call_interleaved");
  CHECK(p.error()->message.find("tool call 0 ('search')") != std::string::npos);
  std::optional<PolicyError> err;
  CHECK(p.finish(err).empty());
  CHECK(err.has_value());
}

TEST_CASE("a stream past k_max_stream_text_bytes fails with stream_too_large instead of growing without bound") {
  // content_all and reasoning_all keep the whole stream for the repairs.
  Resp r;
  auto ctx = r.ctx(tools_request(kSearchTools));
  StreamPipeline p(ctx);
  const json piece = chunk({{"reasoning_content", std::string(std::size_t{16} << 20, 'x')}});
  std::size_t sent = 0;
  while (!p.error() && sent <= k_max_stream_text_bytes) {
    (void)p.on_chunk(piece);
    sent += std::size_t{16} << 20;
  }
  REQUIRE(p.error().has_value());
  CHECK(p.error()->code == k_stream_too_large_code);
  CHECK(p.error()->message.find(std::to_string(servedeck::k_max_stream_text_bytes >> 20) + " MiB") != std::string::npos);
  CHECK(sent >= k_max_stream_text_bytes);  // the chunks' JSON counts too, so that much text is past it
}
