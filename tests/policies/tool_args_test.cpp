// sanitize_tool_tags' ArgumentRepair transducer: keys, value edges, G02 re-split, G07 coercion,
// and the streaming invariant checked with the markup split at EVERY offset.
#include <doctest/doctest.h>

#include <cstdint>

#include "policies/sanitize_tool_tags.hpp"
#include "policies/tag_markup.hpp"
#include "policies/tool_call_repair.hpp"
#include "policy_test_support.hpp"

using namespace servedeck;
using namespace servedeck::policies;
using namespace servedeck::policies::testing;

namespace {

DeclaredTool tool(const std::string& name, json properties, json required = json::array()) {
  return DeclaredTool{name, {{"type", "object"}, {"properties", properties}, {"required", required}}};
}

const DeclaredTool kListDir = tool("list_dir", {{"path", {{"type", "string"}}}}, {"path"});
const DeclaredTool kRead = tool("read", {{"file", {{"type", "string"}}}, {"page", {{"type", "integer"}}}});
const DeclaredTool kReadFileRequired = tool("read", {{"file", {{"type", "string"}}}, {"page", {{"type", "integer"}}}}, {"file"});
const DeclaredTool kEdit = tool("edit", {{"filePath", {{"type", "string"}}}, {"old_string", {{"type", "string"}}}, {"new_string", {{"type", "string"}}}});
const DeclaredTool kSearch = tool("search", {{"query", {{"type", "string"}}}, {"max_results", {{"type", "integer"}}}, {"exact", {{"type", "boolean"}}}});

ArgumentRepairOptions sanitize_only() { return {.sanitize = true, .coerce = false, .allow_resplit = true}; }

// Feeds `raw` split at `cuts` and checks the invariant: every output extends the previous ones,
// and the concatenation equals the whole-text result. Returns the concatenation.
std::string feed_split(const std::string& raw, const std::vector<std::size_t>& cuts, const DeclaredTool* t,
                       ArgumentRepairOptions o, const RepairedArguments& whole) {
  ArgumentRepair r(t, o);
  std::string acc;
  std::size_t prev = 0;
  for (std::size_t c : cuts) {
    acc += r.feed(std::string_view(raw).substr(prev, c - prev));
    prev = c;
    // every emitted prefix is a prefix of the non-streamed result
    if (!whole.error) REQUIRE(whole.text.compare(0, acc.size(), acc) == 0);
  }
  acc += r.feed(std::string_view(raw).substr(prev));
  acc += r.finish();
  CHECK(r.error().has_value() == whole.error.has_value());
  return acc;
}

// Every single split point, and every character on its own.
void check_every_offset(const std::string& raw, const DeclaredTool* t, ArgumentRepairOptions o,
                        const std::string& expected) {
  auto whole = repair_arguments(raw, t, o);
  REQUIRE_FALSE(whole.error.has_value());
  CHECK(whole.text == expected);
  for (std::size_t cut = 0; cut <= raw.size(); ++cut) {
    CAPTURE(cut);
    CHECK(feed_split(raw, {cut}, t, o, whole) == expected);
  }
  std::vector<std::size_t> each;
  for (std::size_t i = 1; i < raw.size(); ++i) each.push_back(i);
  CHECK(feed_split(raw, each, t, o, whole) == expected);
}

}  // namespace

TEST_CASE("markup scanner: complete, damaged and ordinary text") {
  auto tags = markup::scan_tags("a</arg_key>b<arg_value");
  REQUIRE(tags.size() == 2);
  CHECK(tags[0].complete);
  CHECK(tags[0].kind == markup::TagKind::close_key);
  CHECK_FALSE(tags[1].complete);
  CHECK(tags[1].kind == markup::TagKind::open_value);
  CHECK(markup::to_string(tags[0].kind) == "close_key");
  CHECK(markup::scan_tags("if (a<b && c</a>) {}").empty());
  CHECK(markup::is_partial_tag("</arg_k"));
  CHECK_FALSE(markup::is_partial_tag("</arg_key>"));
}

TEST_CASE("repair_key: leaks at either edge, damaged tags, structural damage") {
  auto k = repair_key("path</arg_key>");
  CHECK(k.changed);
  CHECK_FALSE(k.structural);
  CHECK(k.pieces == std::vector<std::string>{"path"});
  CHECK(repair_key("path</arg_").pieces == std::vector<std::string>{"path"});
  CHECK(repair_key("_key>path").pieces == std::vector<std::string>{"path"});
  CHECK(repair_key("<arg_key>path").pieces == std::vector<std::string>{"path"});
  CHECK(repair_key("file<arg_key").structural);
  CHECK(repair_key("file</arg_key><arg_value>a</arg_value><arg_key>page").structural);
  CHECK_FALSE(repair_key("path").changed);
}

TEST_CASE("seed capture: list_dir({\"path</arg_key>\": ...}) at every offset") {
  check_every_offset("{\"path</arg_key>\": \"/Users/user/Desktop/project\"}", &kListDir, sanitize_only(),
                     "{\"path\": \"/Users/user/Desktop/project\"}");
}

TEST_CASE("value edges stripped at every offset; a repaired key takes the schema's spelling") {
  check_every_offset("{\"Path\\n</arg_key>\": \"<arg_value>/src</arg_value>\"}", &kListDir, sanitize_only(),
                     "{\"path\": \"/src\"}");
  check_every_offset("{\"path\":\"/a b</arg_value>\n</tool_call>\"}", &kListDir, sanitize_only(), "{\"path\":\"/a b\"}");
  // a tag escaped the JSON way is still a tag
  check_every_offset("{\"path\":\"/a\\u003c/arg_value>\"}", &kListDir, sanitize_only(), "{\"path\":\"/a\"}");
}

TEST_CASE("G02: literal tags inside a free-text value survive (new_string being edited)") {
  std::string raw =
      "{\"filePath\": \"/src/glm.py\", \"old_string\": \"x = '</arg_key>'\", "
      "\"new_string\": \"out = text.replace('<arg_value>', '').replace('</arg_value>', '')\\nreturn out\"}";
  check_every_offset(raw, &kEdit, sanitize_only(), raw);
}

TEST_CASE("G02: a key that swallowed the next key/value is re-split onto schema keys") {
  // every fragment present: file and page both recovered and typed by the schema
  check_every_offset("{\"file</arg_key><arg_value>a.txt</arg_value><arg_key>page\": \"5\"}", &kRead,
                     sanitize_only(), "{\"file\":\"a.txt\",\"page\":5}");
  // the field case verbatim: file's value was lost in the corruption; page recovered as 5
  check_every_offset("{\"file<arg_key\": \"page</arg_key><arg_value>5\"}", &kRead, sanitize_only(), "{\"page\":5}");
}

TEST_CASE("G02: fragments that do not map onto schema keys are an error, never forwarded") {
  auto r = repair_arguments("{\"file<arg_key\": \"pge</arg_key><arg_value>5\"}", &kRead, sanitize_only());
  REQUIRE(r.error.has_value());
  CHECK(r.error->find("pge") != std::string::npos);
  // a required key whose value was lost is unrecoverable too
  CHECK(repair_arguments("{\"file<arg_key\": \"page</arg_key><arg_value>5\"}", &kReadFileRequired, sanitize_only()).error);
  // without a declared tool there is no schema to map onto
  CHECK(repair_arguments("{\"file<arg_key\": \"page</arg_key><arg_value>5\"}", nullptr, sanitize_only()).error);
  // streamed: nothing of the corrupted pair is ever emitted
  std::string raw = "{\"file<arg_key\": \"pge</arg_key><arg_value>5\"}";
  for (std::size_t cut = 0; cut <= raw.size(); ++cut) {
    ArgumentRepair a(&kRead, sanitize_only());
    std::string acc = a.feed(raw.substr(0, cut));
    acc += a.feed(raw.substr(cut));
    acc += a.finish();
    CHECK(a.error().has_value());
    CHECK(acc.find("pge") == std::string::npos);
    CHECK(acc.find("file") == std::string::npos);
  }
}

TEST_CASE("G07: values coerced to declared types at the end of the call; output buffered") {
  ArgumentRepairOptions o{.sanitize = true, .coerce = true, .allow_resplit = true};
  auto r = repair_arguments("{\"query\":\"x\",\"max_results\":\"10\",\"exact\":\"true\"}", &kSearch, o);
  CHECK(r.coerced);
  CHECK(json::parse(r.text) == json{{"query", "x"}, {"max_results", 10}, {"exact", true}});
  // a string-typed value that looks like a number stays a string
  r = repair_arguments("{\"query\":\"10\"}", &kSearch, o);
  CHECK_FALSE(r.coerced);
  CHECK(r.text == "{\"query\":\"10\"}");
  // not convertible: left alone
  CHECK(json::parse(repair_arguments("{\"max_results\":\"ten\"}", &kSearch, o).text)["max_results"] == "ten");
  // streamed: nothing comes out before the end, then the whole coerced object
  std::string raw = "{\"max_results\":\"10\"}";
  ArgumentRepair a(&kSearch, o);
  for (char c : raw) CHECK(a.feed(std::string(1, c)).empty());
  CHECK(a.finish() == "{\"max_results\":10}");
  // every offset with sanitizing and coercion together
  check_every_offset("{\"max_results</arg_key>\":\"10\"}", &kSearch, o, "{\"max_results\":10}");
}

TEST_CASE("G04: name = declared tool + parameter name is split; unknown names are errors") {
  std::vector<DeclaredTool> tools = {tool("send_command_to_shell", {{"command", {{"type", "string"}}}}, {"command"}),
                                     tool("grep_tool", {{"pattern", {{"type", "string"}}}}, {"pattern"})};
  auto r = resolve_tool_name("send_command_to_shellcommand", tools, true);
  REQUIRE_FALSE(r.error.has_value());
  CHECK(r.name == "send_command_to_shell");
  CHECK(r.split_param == std::optional<std::string>("command"));
  CHECK(arguments_after_split("ls -la", tools[0], "command") == "{\"command\":\"ls -la\"}");
  CHECK(arguments_after_split("{\"command\":\"ls\"}", tools[0], "command") == "{\"command\":\"ls\"}");
  CHECK(resolve_tool_name("grep_tool", tools, true).name == "grep_tool");
  CHECK(resolve_tool_name("<tool_call>grep_tool", tools, true).name == "grep_tool");
  auto bad = resolve_tool_name("send_command", tools, true);
  REQUIRE(bad.error.has_value());
  CHECK(bad.error->find("send_command_to_shell, grep_tool") != std::string::npos);
}

TEST_CASE("raw-text recovery: GLM markup with a missing <arg_value>, hermes JSON") {
  std::vector<DeclaredTool> tools = {tool("search", {{"query", {{"type", "string"}}}}, {"query"}),
                                     tool("get_time", json::object())};
  auto rec = recover_call("<tool_call>search<arg_key>query</arg_key>servedeck policies</arg_value></tool_call>", tools, "search");
  REQUIRE(rec.has_value());
  CHECK(json::parse(rec->arguments) == json{{"query", "servedeck policies"}});
  rec = recover_call("search\n<arg_key>query</arg_key>\nfoo</arg_value>", tools, "search");
  REQUIRE(rec.has_value());
  CHECK(json::parse(rec->arguments) == json{{"query", "foo"}});
  auto calls = extract_calls("x <tool_call>{\"name\": \"get_time\", \"arguments\": {}}</tool_call> y", tools);
  REQUIRE(calls.size() == 1);
  CHECK(calls[0].name == "get_time");
  CHECK(remove_ranges("x <tool_call>{\"name\": \"get_time\", \"arguments\": {}}</tool_call> y", calls) == "x  y");
  CHECK(extract_calls("<tool_call>rm_rf<arg_key>p</arg_key><arg_value>/</arg_value></tool_call>", tools).empty());
}

TEST_CASE("raw-text recovery: Qwen3-Coder's XML markup, typed by the schema; damaged forms") {
  std::vector<DeclaredTool> tools = {kSearch, tool("write", {{"path", {{"type", "string"}}}, {"content", {{"type", "string"}}}}, {"path"})};
  const std::string text =
      "I'll search.\n<tool_call>\n<function=search>\n<parameter=query>\nservedeck <policies>\n</parameter>\n"
      "<parameter=max_results>\n10\n</parameter>\n<parameter=exact>\ntrue\n</parameter>\n</function>\n</tool_call>";
  auto calls = extract_calls(text, tools);
  REQUIRE(calls.size() == 1);
  CHECK(calls[0].name == "search");
  CHECK(json::parse(calls[0].arguments) == json{{"query", "servedeck <policies>"}, {"max_results", 10}, {"exact", true}});
  CHECK(remove_ranges(text, calls) == "I'll search.");
  // A value keeps its inner newlines; only one newline at each edge is the markup's.
  auto w = recover_call("<tool_call>\n<function=write>\n<parameter=path>\na.txt\n</parameter>\n<parameter=content>\n\nline 1\nline 2\n\n"
                        "</parameter>\n</function>\n</tool_call>", tools, "write");
  REQUIRE(w.has_value());
  CHECK(json::parse(w->arguments) == json{{"path", "a.txt"}, {"content", "\nline 1\nline 2\n"}});
  // A missing </parameter> ends the value at the next tag.
  w = recover_call("<tool_call><function=write><parameter=path>b.txt<parameter=content>x</function></tool_call>", tools);
  REQUIRE(w.has_value());
  CHECK(json::parse(w->arguments) == json{{"path", "b.txt"}, {"content", "x"}});
  // Undeclared tool, missing required parameter, stray text, an unnamed function: not calls.
  CHECK(extract_calls("<tool_call><function=rm><parameter=p>/</parameter></function></tool_call>", tools).empty());
  CHECK(extract_calls("<tool_call><function=write><parameter=content>x</parameter></function></tool_call>", tools).empty());
  CHECK(extract_calls("<tool_call><function=write>note <parameter=path>a</parameter></function></tool_call>", tools).empty());
  CHECK(extract_calls("<tool_call><function=>x</function></tool_call>", tools).empty());
  CHECK(extract_calls("<tool_call><function=write><parameter=path>a</parameter></function> tail</tool_call>", tools).empty());
}

TEST_CASE("random argument text: no throw, streamed == whole at every split (fixed seed)") {
  // Alphabet weighted towards JSON structure and markup fragments, so the lexer's edge cases
  // (escapes, partial tags, unterminated strings, stray quotes) come up often.
  const std::vector<std::string> atoms = {"{", "}", "[", "]", "\"", ":", ",", " ", "\\", "\\u003c", "\\n", "a", "5",
                                          "<", ">", "/", "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>",
                                          "<tool_call>", "</tool_call>", "<arg_", "file", "page", "\xc3\xa9", "\xff"};
  uint64_t state = 0x9e3779b97f4a7c15ull;
  auto next = [&state] {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return state;
  };
  for (int round = 0; round < 120; ++round) {
    std::string raw;
    std::size_t n = 1 + next() % 24;
    for (std::size_t i = 0; i < n; ++i) raw += atoms[next() % atoms.size()];
    CAPTURE(raw);
    for (ArgumentRepairOptions o : {sanitize_only(), ArgumentRepairOptions{.sanitize = true, .coerce = true, .allow_resplit = true}}) {
      RepairedArguments whole;
      CHECK_NOTHROW(whole = repair_arguments(raw, &kRead, o));
      for (std::size_t cut = 0; cut <= raw.size(); ++cut) {
        ArgumentRepair a(&kRead, o);
        std::string acc;
        CHECK_NOTHROW(acc = a.feed(raw.substr(0, cut)));
        CHECK_NOTHROW(acc += a.feed(raw.substr(cut)));
        CHECK_NOTHROW(acc += a.finish());
        CHECK(a.error().has_value() == whole.error.has_value());
        if (!whole.error) CHECK(acc == whole.text);
      }
    }
    CHECK_NOTHROW((void)arguments_after_split(raw, kRead, "file"));
    std::vector<DeclaredTool> tools = {kRead};
    CHECK_NOTHROW((void)recover_call(raw, tools, std::string_view("read")));
    CHECK_NOTHROW((void)extract_calls(raw, tools));
  }
}
