// The parsers on real rendered turns: an assistant turn with tool calls and reasoning, rendered
// by the checkpoint's own chat template (GLM-4.5, GLM-4.7, Qwen3-Coder; tests/worker/template/
// fixtures), is exactly the text such a model writes after the generation prompt. Fed back
// through the output parser (at every split), it must give back the reasoning, the content and
// the tool calls with their arguments, typed by the tool schema.
#include <doctest/doctest.h>

#include <fstream>
#include <sstream>
#include <string>

#include "worker/parsers/output_parser.hpp"
#include "worker/template/chat_template.hpp"

using namespace servedeck::worker;
using ojson = nlohmann::ordered_json;

namespace {

std::string fixture(const std::string& name) {
  const char* env = std::getenv("SERVEDECK_SOURCE_DIR");
  const std::string path = std::string(env ? env : SERVEDECK_SOURCE_DIR) + "/tests/worker/template/fixtures/" + name;
  std::ifstream in(path, std::ios::binary);
  REQUIRE_MESSAGE(in.good(), "cannot read " << path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

const ojson k_tools = ojson::parse(R"([
  {"type": "function", "function": {"name": "write_file", "description": "Write a file.",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}, "content": {"type": "string"},
      "mode": {"type": "integer"}, "force": {"type": "boolean"}, "tags": {"type": "array"}}, "required": ["path"]}}},
  {"type": "function", "function": {"name": "list_files", "description": "List files.",
    "parameters": {"type": "object", "properties": {}}}}
])");

const ojson k_args = ojson::parse(R"({"path": "src/<a>.cpp", "content": "int main() {\n  return 0;\n}\n",
                                      "mode": 420, "force": true, "tags": ["x", "y"]})");

/// The conversation whose last assistant turn is parsed back.
ojson context(bool with_reasoning) {
  ojson assistant = {{"role", "assistant"}, {"content", "I'll write it."},
                     {"tool_calls", ojson::array({ojson{{"type", "function"}, {"function", {{"name", "write_file"}, {"arguments", k_args}}}},
                                                 ojson{{"type", "function"}, {"function", {{"name", "list_files"}, {"arguments", ojson::object()}}}}})}};
  if (with_reasoning) assistant["reasoning_content"] = "The user wants a file.";
  return ojson{{"tools", k_tools},
               {"messages", ojson::array({ojson{{"role", "user"}, {"content", "Write src/<a>.cpp."}}, assistant})},
               {"add_generation_prompt", false}};
}

ParsedOutput parse_with(const std::string& text, ToolParserKind kind, bool starts_in_reasoning, bool split_at_every_offset) {
  auto opts = [&] {
    OutputParserOptions o;
    o.reasoning = true;
    o.starts_in_reasoning = starts_in_reasoning;
    o.tool_parser = kind;
    o.tools = nlohmann::json::parse(k_tools.dump());
    auto n = std::make_shared<int>(0);
    o.ids = [n] { return "call_" + std::to_string((*n)++); };
    return o;
  };
  const ParsedOutput whole = parse_whole(text, opts());
  if (split_at_every_offset) {
    for (std::size_t i = 0; i <= text.size(); ++i) {
      OutputParser p(opts());
      ParsedOutput got;
      fold(p.push(text.substr(0, i)), got);
      fold(p.push(text.substr(i)), got);
      fold(p.finish(), got);
      CHECK_MESSAGE(got.content == whole.content, "split at " << i);
      CHECK_MESSAGE(got.reasoning == whole.reasoning, "split at " << i);
      REQUIRE(got.tool_calls.size() == whole.tool_calls.size());
      for (std::size_t k = 0; k < got.tool_calls.size(); ++k) CHECK(got.tool_calls[k].arguments == whole.tool_calls[k].arguments);
    }
  }
  return whole;
}

void check_calls(const ParsedOutput& r) {
  REQUIRE(r.tool_calls.size() == 2);
  CHECK(r.tool_calls[0].name == "write_file");
  CHECK(nlohmann::json::parse(r.tool_calls[0].arguments) == nlohmann::json::parse(k_args.dump()));
  CHECK(r.tool_calls[1].name == "list_files");
  CHECK(r.tool_calls[1].arguments == "{}");
}

}  // namespace

TEST_CASE("GLM-4.5's rendered assistant turn parses back (glm parser, model-opened reasoning)") {
  const auto tmpl = ChatTemplate::parse(fixture("glm_4_5.jinja"));
  const std::string prompt = tmpl.render(context(true));
  const std::string marker = "<|assistant|>";
  const auto at = prompt.rfind(marker);
  REQUIRE(at != std::string::npos);
  const std::string turn = prompt.substr(at + marker.size());  // what the model writes after the generation prompt
  CHECK(turn.rfind("\n<think>The user wants a file.</think>\nI'll write it.\n<tool_call>write_file\n<arg_key>path</arg_key>", 0) == 0);
  const auto r = parse_with(turn, ToolParserKind::glm, false, true);
  CHECK(r.reasoning == "The user wants a file.");
  CHECK(r.content == "\n\nI'll write it.\n\n");  // the newlines around <think> and between the calls
  check_calls(r);
  // The generation prompt: [gMASK]<sop> first, the turn opened by <|assistant|>; enable_thinking
  // false writes the empty block and /nothink.
  ojson ctx = context(false);
  ctx["messages"].erase(1);
  ctx["add_generation_prompt"] = true;
  CHECK(tmpl.render(ctx).rfind("[gMASK]<sop><|system|>\n# Tools", 0) == 0);
  ctx["enable_thinking"] = false;
  const std::string off = tmpl.render(ctx);
  CHECK(off.find("Write src/<a>.cpp./nothink<|assistant|>\n<think></think>") != std::string::npos);
}

TEST_CASE("GLM-4.7's rendered turn (generation prompt opens <think>) parses back from inside the block") {
  const auto tmpl = ChatTemplate::parse(fixture("glm_4_7.jinja"));
  const std::string prompt = tmpl.render(context(true));
  const std::string marker = "<|assistant|><think>";
  const auto at = prompt.rfind(marker);
  REQUIRE(at != std::string::npos);
  // GLM-4.7 writes no newlines around its tool-call tags: the glm parser reads that form too.
  const std::string turn = prompt.substr(at + marker.size());
  CHECK(turn.rfind("The user wants a file.</think>I'll write it.<tool_call>write_file<arg_key>path</arg_key>", 0) == 0);
  const auto r = parse_with(turn, ToolParserKind::glm, true, true);
  CHECK(r.reasoning == "The user wants a file.");
  CHECK(r.content == "I'll write it.");
  check_calls(r);
  ojson ctx = context(false);
  ctx["messages"].erase(1);
  ctx["add_generation_prompt"] = true;
  const std::string on = tmpl.render(ctx);
  CHECK(on.substr(on.size() - 20) == "<|assistant|><think>");
  ctx["enable_thinking"] = false;
  const std::string off = tmpl.render(ctx);
  CHECK(off.substr(off.size() - 21) == "<|assistant|></think>");
}

TEST_CASE("Qwen3-Coder's rendered turn parses back (qwen3_coder parser, values typed by the schema)") {
  const auto tmpl = ChatTemplate::parse(fixture("qwen3_coder.jinja"));
  const std::string prompt = tmpl.render(context(false));
  const std::string marker = "<|im_start|>assistant";
  const auto at = prompt.rfind(marker);
  REQUIRE(at != std::string::npos);
  std::string turn = prompt.substr(at + marker.size());
  const auto end = turn.rfind("<|im_end|>");
  REQUIRE(end != std::string::npos);
  turn.resize(end);
  // The template prints values with Python's str(): 420, True, ['x', 'y'].
  CHECK(turn.find("<parameter=mode>\n420\n</parameter>") != std::string::npos);
  CHECK(turn.find("<parameter=force>\nTrue\n</parameter>") != std::string::npos);
  const auto r = parse_with(turn, ToolParserKind::qwen3_coder, false, true);
  CHECK(r.content == "\nI'll write it.\n\n\n");
  REQUIRE(r.tool_calls.size() == 2);
  const auto a = nlohmann::json::parse(r.tool_calls[0].arguments);
  CHECK(a["path"] == "src/<a>.cpp");
  CHECK(a["content"] == "int main() {\n  return 0;\n}\n");
  CHECK(a["mode"] == 420);
  CHECK(a["force"] == true);
  // A list printed by Python's str() is not JSON; it stays text (vLLM falls back to
  // ast.literal_eval there, which we do not run).
  CHECK(a["tags"] == "['x', 'y']");
  CHECK(r.tool_calls[1].name == "list_files");
  CHECK(r.tool_calls[1].arguments == "{}");
}
