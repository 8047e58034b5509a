// The Qwen3-Coder XML tool-call parser: values typed by the tool's schema, streamed at every
// split (two and three pieces, byte by byte) to exactly the non-streamed parse, malformed markup,
// unterminated calls, and a long value streamed in small pieces in linear time.
#include <doctest/doctest.h>

#include <chrono>
#include <string>
#include <vector>

#include "worker/parsers/output_parser.hpp"
#include "worker/parsers/qwen3_coder_parser.hpp"

using namespace servedeck::worker;
using json = nlohmann::json;

namespace {

ToolCallIdGenerator counter_ids() {
  auto n = std::make_shared<int>(0);
  return [n] { return "call_" + std::to_string((*n)++); };
}

OutputParserOptions opts(const json& tools, bool reasoning = false, bool starts = false) {
  OutputParserOptions o;
  o.reasoning = reasoning;
  o.starts_in_reasoning = starts;
  o.tool_parser = ToolParserKind::qwen3_coder;
  o.tools = tools;
  o.ids = counter_ids();
  return o;
}

bool same(const ParsedOutput& a, const ParsedOutput& b) {
  if (a.content != b.content || a.reasoning != b.reasoning || a.tool_calls.size() != b.tool_calls.size()) return false;
  for (std::size_t i = 0; i < a.tool_calls.size(); ++i)
    if (a.tool_calls[i].id != b.tool_calls[i].id || a.tool_calls[i].name != b.tool_calls[i].name ||
        a.tool_calls[i].arguments != b.tool_calls[i].arguments)
      return false;
  return true;
}

ParsedOutput stream(const std::vector<std::string>& pieces, OutputParserOptions o) {
  OutputParser p(std::move(o));
  ParsedOutput out;
  for (const auto& piece : pieces) {
    const auto d = p.push(piece);
    for (const auto& x : d)
      if (x.kind == DeltaKind::content)
        for (std::string_view tag : {"<tool_call>", "<function=", "<parameter="})
          CHECK_MESSAGE(partial_tag_suffix(x.text, tag) == 0, "content delta '" << x.text << "' ends inside a tag");
    fold(d, out);
  }
  fold(p.finish(), out);
  return out;
}

void check_every_split(const std::string& text, const json& tools, bool reasoning = false, bool starts = false) {
  const ParsedOutput whole = parse_whole(text, opts(tools, reasoning, starts));
  for (std::size_t i = 0; i <= text.size(); ++i)
    CHECK_MESSAGE(same(stream({text.substr(0, i), text.substr(i)}, opts(tools, reasoning, starts)), whole),
                  "split at offset " << i << " of: " << text);
  for (std::size_t i = 0; i + 1 < text.size(); ++i)
    CHECK_MESSAGE(same(stream({text.substr(0, i), text.substr(i, 2), text.substr(i + 2)}, opts(tools, reasoning, starts)),
                       whole),
                  "3-way split at offset " << i << " of: " << text);
  std::vector<std::string> bytes;
  for (char c : text) bytes.emplace_back(1, c);
  CHECK(same(stream(bytes, opts(tools, reasoning, starts)), whole));
}

const json k_tools = json::parse(R"([
  {"type":"function","function":{"name":"write_file","parameters":{"type":"object","properties":{
     "path":{"type":"string"},"content":{"type":"string"},"mode":{"type":"integer"},
     "ratio":{"type":"number"},"append":{"type":"boolean"},"tags":{"type":"array"},
     "meta":{"type":"object"},"owner":{"type":["null","string"]},"count":{"type":"int64"}}}}},
  {"type":"function","function":{"name":"list_files","parameters":{"type":"object","properties":{}}}}
])");

}  // namespace

TEST_CASE("qwen3_coder_value types a value by the schema as vLLM's qwen3_coder parser does") {
  auto v = [](std::string_view key, std::string_view text) { return qwen3_coder_value(k_tools, "write_file", key, text); };
  CHECK(v("path", "42") == "42");        // declared string: verbatim
  CHECK(v("mode", "420") == 420);
  CHECK(v("mode", " +7 ") == 7);
  CHECK(v("mode", "7.5") == "7.5");      // not an integer: the text
  CHECK(v("count", "-3") == -3);         // int64 is an int type
  CHECK(v("ratio", "0.25") == 0.25);
  CHECK(v("ratio", "3.0") == 3);         // integral floats become integers
  CHECK(v("ratio", "1e400") == "1e400"); // not finite: the text
  CHECK(v("ratio", "abc") == "abc");
  CHECK(v("append", "True") == true);
  CHECK(v("append", "false") == false);
  CHECK(v("append", "yes") == "yes");    // neither: the text (vLLM answers false)
  CHECK(v("tags", "[1, \"a\"]") == json::parse(R"([1, "a"])"));
  CHECK(v("meta", "{\"k\": {\"x\": null}}") == json::parse(R"({"k": {"x": null}})"));
  CHECK(v("meta", "{not json") == "{not json");
  CHECK(v("owner", "ann") == "ann");     // ["null", "string"]: the first non-null type
  CHECK(v("mode", "NULL").is_null());    // "null" is null for every type
  CHECK(v("path", "null").is_null());
  CHECK(v("undeclared", "5") == "5");    // not in the schema: a string
  CHECK(qwen3_coder_value(k_tools, "no_such_tool", "mode", "5") == "5");
  CHECK(qwen3_coder_value(json(), "write_file", "mode", "5") == "5");
  CHECK(qwen3_coder_value(json::parse(R"([{"function":{"name":"write_file","parameters":"bad"}}])"), "write_file", "mode",
                          "5") == "5");
}

TEST_CASE("qwen3_coder: the template's markup parses into typed calls, every split") {
  const std::string text =
      "I'll write it.\n<tool_call>\n<function=write_file>\n<parameter=path>\nsrc/<main>.cpp\n</parameter>\n"
      "<parameter=content>\nint main() {\n  return 0;\n}\n\n</parameter>\n<parameter=mode>\n420\n</parameter>\n"
      "<parameter=append>\nfalse\n</parameter>\n<parameter=tags>\n[\"a\", 2]\n</parameter>\n</function>\n"
      "</tool_call>\n<tool_call>\n<function=list_files>\n</function>\n</tool_call>";
  const auto r = parse_whole(text, opts(k_tools));
  CHECK(r.content == "I'll write it.\n\n");
  REQUIRE(r.tool_calls.size() == 2);
  CHECK(r.tool_calls[0].id == "call_0");
  CHECK(r.tool_calls[0].name == "write_file");
  const auto a = json::parse(r.tool_calls[0].arguments);
  CHECK(a["path"] == "src/<main>.cpp");
  CHECK(a["content"] == "int main() {\n  return 0;\n}\n");  // one leading and one trailing newline removed
  CHECK(a["mode"] == 420);
  CHECK(a["append"] == false);
  CHECK(a["tags"] == json::parse(R"(["a", 2])"));
  CHECK(r.tool_calls[1].name == "list_files");
  CHECK(r.tool_calls[1].arguments == "{}");
  check_every_split(text, k_tools);
}

TEST_CASE("qwen3_coder: a missing </parameter> ends the value at the next tag, as vLLM reads it") {
  const std::string text =
      "<tool_call>\n<function=write_file>\n<parameter=path>\na.txt\n<parameter=mode>\n7\n</function>\n</tool_call>";
  const auto r = parse_whole(text, opts(k_tools));
  REQUIRE(r.tool_calls.size() == 1);
  CHECK(json::parse(r.tool_calls[0].arguments) == json{{"path", "a.txt"}, {"mode", 7}});
  check_every_split(text, k_tools);
}

TEST_CASE("qwen3_coder: reasoning first, markup inside reasoning is not a call") {
  const std::string text =
      "plan <tool_call><function=x></function></tool_call></think>\n\n<tool_call>\n<function=list_files>\n</function>\n"
      "</tool_call>";
  const auto r = parse_whole(text, opts(k_tools, true, true));
  CHECK(r.reasoning == "plan <tool_call><function=x></function></tool_call>");
  CHECK(r.content == "\n\n");
  REQUIRE(r.tool_calls.size() == 1);
  CHECK(r.tool_calls[0].name == "list_files");
  check_every_split(text, k_tools, true, true);
}

TEST_CASE("qwen3_coder: markup that names no function stays content; stray text inside a call is dropped") {
  for (const std::string bad : {"a<tool_call>\n{\"name\": \"f\"}\n</tool_call>b", "a<tool_call><function=>x</tool_call>b",
                                "a<tool_call><function=has space>\n</function></tool_call>b"}) {
    const auto r = parse_whole(bad, opts(k_tools));
    CHECK(r.tool_calls.empty());
    CHECK(r.content == bad);
    check_every_split(bad, k_tools);
  }
  const std::string stray =
      "<tool_call>\n<function=write_file>\nnoise <parameter=path>\np\n</parameter>\nmore noise\n</function>\n</tool_call>";
  const auto s = parse_whole(stray, opts(k_tools));
  REQUIRE(s.tool_calls.size() == 1);
  CHECK(json::parse(s.tool_calls[0].arguments) == json{{"path", "p"}});
  check_every_split(stray, k_tools);
}

TEST_CASE("qwen3_coder: an unterminated call at the end of output keeps what was written") {
  const std::string cut = "<tool_call>\n<function=write_file>\n<parameter=path>\na.txt\n</parameter>\n<parameter=content>\nhal";
  const auto r = parse_whole(cut, opts(k_tools));
  REQUIRE(r.tool_calls.size() == 1);
  CHECK(json::parse(r.tool_calls[0].arguments) == json{{"path", "a.txt"}, {"content", "hal"}});
  check_every_split(cut, k_tools);

  const std::string name_only = "<tool_call>\n<function=list_files>";
  const auto n = parse_whole(name_only, opts(k_tools));
  REQUIRE(n.tool_calls.size() == 1);
  CHECK(n.tool_calls[0].arguments == "{}");
  check_every_split(name_only, k_tools);
}

TEST_CASE("qwen3_coder: the call starts at its name and each parameter streams when complete") {
  OutputParser p(opts(k_tools));
  auto d1 = p.push("<tool_call>\n<function=write_file>\n<parameter=mode>\n6");
  REQUIRE(d1.size() == 1);
  CHECK(d1[0].kind == DeltaKind::tool_call_start);
  CHECK(d1[0].name == "write_file");
  auto d2 = p.push("44\n</parameter>\n");
  REQUIRE(d2.size() == 1);
  CHECK(d2[0].kind == DeltaKind::tool_call_arguments);
  CHECK(d2[0].text == "{\"mode\": 644");
  auto d3 = p.push("</function>\n</tool_call>");
  REQUIRE(d3.size() == 1);
  CHECK(d3[0].text == "}");
  CHECK(p.finish().empty());
  CHECK(p.tool_calls() == 1);
}

TEST_CASE("qwen3_coder: a 2 MB value streamed 3 bytes at a time parses in linear time") {
  const std::string body(2 << 20, 'x');
  const std::string text = "<tool_call>\n<function=write_file>\n<parameter=content>\n" + body + "\n</parameter>\n</function>\n</tool_call>";
  OutputParser p(opts(k_tools));
  ParsedOutput out;
  const auto t0 = std::chrono::steady_clock::now();
  for (std::size_t i = 0; i < text.size(); i += 3) fold(p.push(text.substr(i, 3)), out);
  fold(p.finish(), out);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  REQUIRE(out.tool_calls.size() == 1);
  CHECK(json::parse(out.tool_calls[0].arguments)["content"].get<std::string>().size() == body.size());
  // note: quadratic rescanning of the value would take minutes here; linear takes well under 1 s
  // even unoptimised under sanitizers.
  CHECK_MESSAGE(s < 20.0, "took " << s << " s");
}
