// Reasoning split and tool-call parsers: the same text split at every offset (and fed byte by
// byte) must fold to exactly the non-streamed parse, and no delta may carry part of a tag.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "worker/parsers/output_parser.hpp"

using namespace servedeck::worker;

namespace {

ToolCallIdGenerator counter_ids() {
  auto n = std::make_shared<int>(0);
  return [n] { return "call_" + std::to_string((*n)++); };
}

OutputParserOptions opts(bool reasoning, bool starts, ToolParserKind kind,
                         nlohmann::json tools = nlohmann::json()) {
  OutputParserOptions o;
  o.reasoning = reasoning;
  o.starts_in_reasoning = starts;
  o.tool_parser = kind;
  o.tools = std::move(tools);
  o.ids = counter_ids();
  return o;
}

bool same(const ParsedOutput& a, const ParsedOutput& b) {
  if (a.content != b.content || a.reasoning != b.reasoning) return false;
  if (a.tool_calls.size() != b.tool_calls.size()) return false;
  for (std::size_t i = 0; i < a.tool_calls.size(); ++i) {
    if (a.tool_calls[i].id != b.tool_calls[i].id || a.tool_calls[i].name != b.tool_calls[i].name ||
        a.tool_calls[i].arguments != b.tool_calls[i].arguments)
      return false;
  }
  return true;
}

bool has_partial_tag(const std::string& s) {
  // A delta ending in a proper prefix of one of the tags means a tag was split across deltas.
  for (std::string_view tag : {"<think>", "</think>", "<tool_call>", "</tool_call>"}) {
    if (partial_tag_suffix(s, tag) > 0) return true;
  }
  return false;
}

// Feeds `pieces`; checks no content/reasoning delta ends in a partial tag unless the whole text
// did too; returns the fold.
ParsedOutput stream(const std::vector<std::string>& pieces, OutputParserOptions o, bool whole_has_partial) {
  OutputParser p(std::move(o));
  ParsedOutput out;
  for (const auto& piece : pieces) {
    auto d = p.push(piece);
    for (const auto& x : d) {
      if (!whole_has_partial && (x.kind == DeltaKind::content || x.kind == DeltaKind::reasoning)) {
        CHECK_MESSAGE(!has_partial_tag(x.text), "delta '" << x.text << "' ends inside a tag");
      }
    }
    fold(d, out);
  }
  fold(p.finish(), out);
  return out;
}

// The split-at-every-offset property for one text and configuration.
void check_every_split(const std::string& text, bool reasoning, bool starts, ToolParserKind kind,
                       const nlohmann::json& tools = nlohmann::json()) {
  const ParsedOutput whole = parse_whole(text, opts(reasoning, starts, kind, tools));
  const bool partial_end = has_partial_tag(text);
  for (std::size_t i = 0; i <= text.size(); ++i) {
    const auto got = stream({text.substr(0, i), text.substr(i)}, opts(reasoning, starts, kind, tools), partial_end);
    CHECK_MESSAGE(same(got, whole), "split at offset " << i << " of: " << text);
  }
  for (std::size_t i = 0; i + 1 < text.size(); ++i) {  // three pieces around every offset
    const auto got = stream({text.substr(0, i), text.substr(i, 2), text.substr(i + 2)},
                            opts(reasoning, starts, kind, tools), partial_end);
    CHECK_MESSAGE(same(got, whole), "3-way split at offset " << i << " of: " << text);
  }
  std::vector<std::string> bytes;
  for (char c : text) bytes.emplace_back(1, c);
  CHECK(same(stream(bytes, opts(reasoning, starts, kind, tools), partial_end), whole));
}

const nlohmann::json k_tools = nlohmann::json::parse(R"([
  {"type":"function","function":{"name":"read","parameters":{"type":"object","properties":{
     "file":{"type":"string"},"page":{"type":"integer"},"opts":{"type":"object"}}}}},
  {"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{
     "city":{"type":"string"}}}}}
])");

}  // namespace

TEST_CASE("reasoning split: model opens the block itself") {
  const std::string text = "<think>\nLet me think: 2<3 and </thi is not a tag.\n</think>\n\nThe answer is 4.";
  const auto r = parse_whole(text, opts(true, false, ToolParserKind::none));
  CHECK(r.reasoning == "\nLet me think: 2<3 and </thi is not a tag.\n");
  CHECK(r.content == "\n\nThe answer is 4.");
  check_every_split(text, true, false, ToolParserKind::none);
}

TEST_CASE("reasoning split: template opened the block; repeated opening tag dropped") {
  const std::string a = "I should greet.</think>Hello!";
  const auto ra = parse_whole(a, opts(true, true, ToolParserKind::none));
  CHECK(ra.reasoning == "I should greet.");
  CHECK(ra.content == "Hello!");
  check_every_split(a, true, true, ToolParserKind::none);

  const std::string b = "<think>I should greet.</think>Hello!";
  const auto rb = parse_whole(b, opts(true, true, ToolParserKind::none));
  CHECK(rb.reasoning == "I should greet.");
  CHECK(rb.content == "Hello!");
  check_every_split(b, true, true, ToolParserKind::none);
}

TEST_CASE("reasoning split: unterminated block is all reasoning; disabled parser is all content") {
  const std::string text = "<think>still thinking when max_tokens hit <";
  const auto r = parse_whole(text, opts(true, false, ToolParserKind::none));
  CHECK(r.reasoning == "still thinking when max_tokens hit <");
  CHECK(r.content.empty());
  check_every_split(text, true, false, ToolParserKind::none);
  const auto off = parse_whole(text, opts(false, false, ToolParserKind::none));
  CHECK(off.content == text);
  CHECK(off.reasoning.empty());
}

TEST_CASE("hermes tool calls with reasoning and surrounding content") {
  const std::string text =
      "<think>need weather</think>Checking.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
      "{\"city\": \"Paris <b>\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"read\", \"arguments\": "
      "{\"file\": \"a.txt\", \"page\": 2}}\n</tool_call>";
  const auto r = parse_whole(text, opts(true, false, ToolParserKind::hermes));
  CHECK(r.reasoning == "need weather");
  CHECK(r.content == "Checking.\n\n");
  REQUIRE(r.tool_calls.size() == 2);
  CHECK(r.tool_calls[0].id == "call_0");
  CHECK(r.tool_calls[0].name == "get_weather");
  CHECK(nlohmann::json::parse(r.tool_calls[0].arguments) == nlohmann::json{{"city", "Paris <b>"}});
  CHECK(r.tool_calls[1].name == "read");
  CHECK(nlohmann::json::parse(r.tool_calls[1].arguments) == nlohmann::json{{"file", "a.txt"}, {"page", 2}});
  check_every_split(text, true, false, ToolParserKind::hermes);
}

TEST_CASE("hermes: malformed call stays content; tool markup inside reasoning is not a call") {
  const std::string bad = "x<tool_call>\n{not json}\n</tool_call>y";
  const auto r = parse_whole(bad, opts(false, false, ToolParserKind::hermes));
  CHECK(r.tool_calls.empty());
  CHECK(r.content == bad);
  check_every_split(bad, false, false, ToolParserKind::hermes);

  const std::string in_think = "<think><tool_call>{\"name\":\"f\"}</tool_call></think>ok";
  const auto t = parse_whole(in_think, opts(true, false, ToolParserKind::hermes));
  CHECK(t.tool_calls.empty());
  CHECK(t.reasoning == "<tool_call>{\"name\":\"f\"}</tool_call>");
  CHECK(t.content == "ok");
}

TEST_CASE("hermes: unterminated call at end of output still parses") {
  const std::string text = "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n";
  const auto r = parse_whole(text, opts(false, false, ToolParserKind::hermes));
  REQUIRE(r.tool_calls.size() == 1);
  CHECK(r.tool_calls[0].name == "f");
  CHECK(r.tool_calls[0].arguments == "{}");
  check_every_split(text, false, false, ToolParserKind::hermes);
}

TEST_CASE("glm tool calls: typed values per schema, strings kept verbatim") {
  const std::string text =
      "Reading.<tool_call>read\n<arg_key>file</arg_key>\n<arg_value>src/<main>.cpp</arg_value>\n"
      "<arg_key>page</arg_key>\n<arg_value>5</arg_value>\n<arg_key>opts</arg_key>\n"
      "<arg_value>{\"a\": [1, 2]}</arg_value>\n</tool_call><tool_call>get_weather\n"
      "<arg_key>city</arg_key>\n<arg_value>42</arg_value>\n</tool_call>";
  const auto r = parse_whole(text, opts(true, true, ToolParserKind::glm, k_tools));
  // starts_in_reasoning with no </think>: everything is reasoning, no calls.
  CHECK(r.tool_calls.empty());

  const auto c = parse_whole(text, opts(false, false, ToolParserKind::glm, k_tools));
  CHECK(c.content == "Reading.");
  REQUIRE(c.tool_calls.size() == 2);
  CHECK(c.tool_calls[0].name == "read");
  const auto a0 = nlohmann::json::parse(c.tool_calls[0].arguments);
  CHECK(a0["file"] == "src/<main>.cpp");
  CHECK(a0["page"] == 5);
  CHECK(a0["opts"] == nlohmann::json::parse(R"({"a":[1,2]})"));
  CHECK(c.tool_calls[1].name == "get_weather");
  CHECK(nlohmann::json::parse(c.tool_calls[1].arguments)["city"] == "42");  // declared string
  check_every_split(text, false, false, ToolParserKind::glm, k_tools);
}

TEST_CASE("glm: no arguments, reasoning first, and unterminated call") {
  const std::string text = "plan</think>\n<tool_call>list_files\n</tool_call>";
  const auto r = parse_whole(text, opts(true, true, ToolParserKind::glm, k_tools));
  CHECK(r.reasoning == "plan");
  CHECK(r.content == "\n");
  REQUIRE(r.tool_calls.size() == 1);
  CHECK(r.tool_calls[0].name == "list_files");
  CHECK(r.tool_calls[0].arguments == "{}");
  check_every_split(text, true, true, ToolParserKind::glm, k_tools);

  const std::string cut = "<tool_call>read\n<arg_key>file</arg_key><arg_value>a</arg_value><arg_key>pa";
  const auto u = parse_whole(cut, opts(false, false, ToolParserKind::glm, k_tools));
  REQUIRE(u.tool_calls.size() == 1);
  CHECK(nlohmann::json::parse(u.tool_calls[0].arguments) == nlohmann::json{{"file", "a"}});
  check_every_split(cut, false, false, ToolParserKind::glm, k_tools);
}

TEST_CASE("glm: value untyped by schema stays a string even when it looks like JSON") {
  const std::string text = "<tool_call>unknown_tool\n<arg_key>n</arg_key>\n<arg_value>7</arg_value>\n</tool_call>";
  const auto r = parse_whole(text, opts(false, false, ToolParserKind::glm, k_tools));
  REQUIRE(r.tool_calls.size() == 1);
  CHECK(nlohmann::json::parse(r.tool_calls[0].arguments)["n"] == "7");
}

TEST_CASE("streamed glm call starts before its arguments arrive") {
  OutputParser p(opts(false, false, ToolParserKind::glm, k_tools));
  auto d1 = p.push("<tool_call>read\n<arg_key>file</arg_key><arg_value>x");
  REQUIRE(d1.size() == 1);
  CHECK(d1[0].kind == DeltaKind::tool_call_start);
  CHECK(d1[0].name == "read");
  auto d2 = p.push("</arg_value>");
  REQUIRE(d2.size() == 1);
  CHECK(d2[0].kind == DeltaKind::tool_call_arguments);
  CHECK(d2[0].text == "{\"file\": \"x\"");
}

TEST_CASE("hermes: a call starts and streams its arguments before the closing tag") {
  OutputParser p(opts(false, false, ToolParserKind::hermes));
  auto d1 = p.push("<tool_call>\n{\"name\": \"write\", \"arguments\": {\"text\": \"long");
  REQUIRE(d1.size() == 2);
  CHECK(d1[0].kind == DeltaKind::tool_call_start);
  CHECK(d1[0].name == "write");
  CHECK(d1[1].kind == DeltaKind::tool_call_arguments);
  CHECK(d1[1].text == "{\"text\": \"long");
  auto d2 = p.push(" body\"}");
  REQUIRE(d2.size() == 1);
  CHECK(d2[0].text == " body\"");  // the '}' is held: it may close the outer object
  auto d3 = p.push("}\n</tool_call>");
  REQUIRE(d3.size() == 1);
  CHECK(d3[0].text == "}");
  CHECK(p.finish().empty());
}

TEST_CASE("hermes: other key orders, escaped names and missing arguments parse whole") {
  for (const std::string& text : {
           std::string("<tool_call>\n{\"arguments\": {\"q\": \"x\"}, \"name\": \"search\"}\n</tool_call>"),
           std::string("<tool_call>{\"name\": \"se\\u0061rch\", \"arguments\": {\"q\": \"x\"}}</tool_call>"),
           std::string("<tool_call>\n{\"name\": \"search\"}\n</tool_call>"),
           std::string("<tool_call>\n{\"name\": \"search\", \"arguments\": {\"q\": \"}}\"}}\n</tool_call>tail"),
       }) {
    const auto r = parse_whole(text, opts(false, false, ToolParserKind::hermes));
    REQUIRE_MESSAGE(r.tool_calls.size() == 1, text);
    CHECK(r.tool_calls[0].name == "search");
    const auto args = nlohmann::json::parse(r.tool_calls[0].arguments, nullptr, false);
    CHECK_MESSAGE(args.is_object(), r.tool_calls[0].arguments);
    check_every_split(text, false, false, ToolParserKind::hermes);
  }
}

TEST_CASE("tool-call JSON nested past the request limit stays text instead of overflowing the stack") {
  // note: nlohmann's dump recurses once per level; 200000 levels of model output crashed the
  // worker (SEGV in serializer::dump) before the parsers went through parse_untrusted.
  const std::size_t depth = 200000;
  const std::string deep = std::string(depth, '[') + std::string(depth, ']');
  const std::string hermes = "<tool_call>\n{\"arguments\": " + deep + ", \"name\": \"f\"}\n</tool_call>";
  const auto h = parse_whole(hermes, opts(false, false, ToolParserKind::hermes));
  CHECK(h.tool_calls.empty());
  CHECK(h.content == hermes);  // as a malformed call

  const nlohmann::json tools = nlohmann::json::parse(
      R"([{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{"x":{"type":"array"}}}}}])");
  const auto g = parse_whole("<tool_call>f\n<arg_key>x</arg_key>\n<arg_value>" + deep + "</arg_value>\n</tool_call>",
                             opts(false, false, ToolParserKind::glm, tools));
  REQUIRE(g.tool_calls.size() == 1);
  CHECK(g.tool_calls[0].arguments.size() > 2 * depth);  // kept as the string the model wrote

  const auto q = parse_whole("<tool_call>\n<function=f>\n<parameter=x>\n" + deep + "\n</parameter>\n</function>\n</tool_call>",
                             opts(false, false, ToolParserKind::qwen3_coder, tools));
  REQUIRE(q.tool_calls.size() == 1);
  CHECK(q.tool_calls[0].arguments.size() > 2 * depth);
}
