// make_agent_conversation: the agent-loop replay's conversation (bench_agent_loop), built
// through the model's real chat template and tokenizer (load_hf_text_model: tokenizer.json and
// tokenizer_config.json's chat_template, Qwen3's here). A coding agent's session: a system
// prompt, 50 tool schemas, a user task, then alternating assistant turns (reasoning + one tool
// call) and tool results of the sizes an agent sees (file reads of 4.5-11 KB, search and test
// output, short edit acknowledgements), until the prompt passes --min-tokens and --min-turns.
// The text is generated from a fixed seed (code-like lines and prose from word lists): the
// template, the tokenizer and the sizes are real, the words are not.
//
// Each turn's prompt is the whole conversation so far rendered with add_generation_prompt, as
// an agent resends it. The last turn comes in --variants versions whose last assistant turn and
// tool result differ (other words, the same lengths in characters), so that each of the replay's configurations meets a last
// turn it has not cached, with the conversation before it cached.
//
// Output (little-endian): "SDAL1\0\0\0", uint32 prompts, then per prompt uint32 turn, uint32
// variant, uint32 tokens, int32 ids[tokens].
// Usage: make_agent_conversation --tokenizer-dir DIR --out FILE [--min-tokens 66000] [--min-turns 30] [--variants 3]
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "worker/server/hf_text_model.hpp"

using nlohmann::json;

namespace {

const char* const k_words[] = {"the", "request", "handler", "returns", "an", "error", "when", "buffer", "is", "full", "and",
                               "retries", "after", "timeout", "config", "value", "parser", "reads", "field", "from", "stream",
                               "cache", "entry", "expires", "on", "write", "client", "sends", "header", "before", "body",
                               "worker", "thread", "holds", "lock", "while", "queue", "drains", "test", "fails", "because",
                               "offset", "overflows", "index", "range", "check", "missing", "path", "resolves", "module"};
const char* const k_idents[] = {"request", "buffer", "offset", "len", "config", "parser", "state", "result", "entry",
                                "cache", "handle", "items", "count", "limit", "socket", "header", "payload", "options",
                                "queue", "node", "index", "path", "file", "stream", "token", "span", "error", "status"};
const char* const k_types[] = {"std::size_t", "int", "bool", "std::string", "Status", "Buffer&", "const Config&", "Span<const char>"};

struct Gen {
  std::mt19937 rng;
  explicit Gen(unsigned seed) : rng(seed) {}
  int pick(int n) { return std::uniform_int_distribution<int>(0, n - 1)(rng); }
  template <std::size_t N>
  const char* of(const char* const (&a)[N]) { return a[pick(static_cast<int>(N))]; }
  std::string prose(int words) {
    std::string s;
    for (int i = 0; i < words; ++i) {
      s += i ? " " : "";
      s += of(k_words);
      if (pick(12) == 0) s += ".";
    }
    return s + ".";
  }
  std::string code_line(int indent) {
    std::string s(static_cast<std::size_t>(indent), ' ');
    switch (pick(6)) {
      case 0: return s + "const auto " + of(k_idents) + " = " + of(k_idents) + "." + of(k_idents) + "(" + of(k_idents) + ", " + std::to_string(pick(4096)) + ");";
      case 1: return s + "if (" + of(k_idents) + " >= " + of(k_idents) + ".size()) return Status::" + (pick(2) ? "kFull;" : "kInvalid;");
      case 2: return s + of(k_types) + " " + of(k_idents) + "_" + of(k_idents) + " = " + std::to_string(pick(100)) + ";";
      case 3: return s + "for (std::size_t i = 0; i < " + of(k_idents) + ".size(); ++i) " + of(k_idents) + "[i] += " + of(k_idents) + "[i];";
      case 4: return s + "// " + prose(6 + pick(8));
      default: return s + of(k_idents) + "->" + of(k_idents) + "(" + of(k_idents) + ");";
    }
  }
  /// About `chars` characters of a source file with line numbers (a read_file result).
  std::string file(int chars, const std::string& name) {
    std::string s = "File: " + name + "\n";
    for (int line = 1; static_cast<int>(s.size()) < chars; ++line) s += std::to_string(line) + "\t" + code_line(2 * pick(3)) + "\n";
    return s;
  }
  std::string grep(int chars) {
    std::string s;
    while (static_cast<int>(s.size()) < chars)
      s += "src/" + std::string(of(k_idents)) + "/" + of(k_idents) + ".cpp:" + std::to_string(1 + pick(900)) + ":" + code_line(1) + "\n";
    return s;
  }
  std::string test_output(int chars) {
    std::string s = "[==========] Running tests.\n";
    while (static_cast<int>(s.size()) < chars) {
      const std::string name = std::string(of(k_idents)) + "_" + of(k_idents);
      s += "[ RUN      ] " + name + "\n";
      if (pick(5) == 0) s += "test/" + name + ".cpp:" + std::to_string(pick(400)) + ": Failure\nExpected: " + of(k_idents) + " == " + std::to_string(pick(64)) + "\n  Actual: " + std::to_string(pick(64)) + "\n[  FAILED  ] " + name + "\n";
      else s += "[       OK ] " + name + " (" + std::to_string(pick(40)) + " ms)\n";
    }
    return s;
  }
};

json tool_schemas(Gen& g) {
  const char* const names[] = {"read_file", "write_file", "edit_file", "list_dir", "glob", "grep", "run_command", "run_tests",
                               "git_status", "git_diff", "git_log", "git_commit", "web_fetch", "web_search", "todo_write",
                               "todo_read", "ask_user", "create_dir", "delete_file", "move_file", "copy_file", "format_file",
                               "lint", "typecheck", "build", "install_package", "search_symbols", "goto_definition",
                               "find_references", "rename_symbol", "open_pr", "review_pr", "read_notebook", "edit_notebook",
                               "start_server", "stop_server", "http_request", "query_db", "read_logs", "tail_logs",
                               "profile", "benchmark", "screenshot", "spawn_agent", "wait_agent", "read_env", "set_env",
                               "compress", "extract", "checksum"};
  json tools = json::array();
  for (const char* name : names) {
    json props = json::object();
    json required = json::array();
    const int n = 2 + g.pick(4);
    for (int i = 0; i < n; ++i) {
      const std::string p = std::string(g.of(k_idents)) + (i ? "_" + std::to_string(i) : "");
      props[p] = {{"type", g.pick(3) == 0 ? "integer" : g.pick(4) == 0 ? "boolean" : "string"}, {"description", g.prose(8 + g.pick(10))}};
      if (i < 2) required.push_back(p);
    }
    tools.push_back({{"type", "function"},
                     {"function", {{"name", name}, {"description", g.prose(18 + g.pick(24))},
                                   {"parameters", {{"type", "object"}, {"properties", props}, {"required", required}}}}}});
  }
  return tools;
}

/// One agent step: the assistant turn (reasoning + a tool call) and the tool's result.
std::pair<json, json> step(Gen& g, int turn) {
  static const char* const calls[] = {"read_file", "grep", "run_tests", "edit_file", "read_file", "run_command", "read_file", "grep"};
  const std::string tool = calls[g.pick(8)];
  const std::string id = "call_" + std::to_string(turn);
  const std::string path = "src/" + std::string(g.of(k_idents)) + "/" + g.of(k_idents) + ".cpp";
  json args = tool == "grep" ? json{{"pattern", g.of(k_idents)}, {"path", "src"}}
              : tool == "run_tests" ? json{{"filter", std::string(g.of(k_idents)) + "*"}}
              : tool == "run_command" ? json{{"command", "make -j8 " + std::string(g.of(k_idents))}}
              : tool == "edit_file" ? json{{"path", path}, {"old", g.code_line(2)}, {"new", g.code_line(2)}}
                                    : json{{"path", path}};
  json assistant = {{"role", "assistant"}, {"content", ""}, {"reasoning_content", g.prose(120 + g.pick(280))},
                    {"tool_calls", json::array({{{"id", id}, {"type", "function"}, {"function", {{"name", tool}, {"arguments", args}}}}})}};
  std::string result;
  if (tool == "read_file") result = g.file(4500 + g.pick(6500), path);
  else if (tool == "grep") result = g.grep(1200 + g.pick(2500));
  else if (tool == "run_tests") result = g.test_output(2000 + g.pick(3200));
  else if (tool == "run_command") result = g.test_output(800 + g.pick(2400));
  else result = "Edited " + path + ": 1 replacement.";
  json tool_msg = {{"role", "tool"}, {"tool_call_id", id}, {"content", result}};
  return {assistant, tool_msg};
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir, out;
  std::size_t min_tokens = 66000;
  int min_turns = 30, variants = 3;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--tokenizer-dir") dir = argv[i + 1];
    else if (a == "--out") out = argv[i + 1];
    else if (a == "--min-tokens") min_tokens = std::strtoul(argv[i + 1], nullptr, 10);
    else if (a == "--min-turns") min_turns = std::atoi(argv[i + 1]);
    else if (a == "--variants") variants = std::atoi(argv[i + 1]);
  }
  if (dir.empty() || out.empty() || variants < 1) {
    std::fprintf(stderr, "usage: make_agent_conversation --tokenizer-dir DIR --out FILE [--min-tokens N] [--min-turns N] [--variants N]\n");
    return 2;
  }
  const auto model = servedeck::worker::load_hf_text_model(dir);
  Gen g(20261201);
  const json tools = tool_schemas(g);
  std::string system = "You are a coding agent working in the user's repository. ";
  for (int i = 0; i < 12; ++i) system += g.prose(60) + "\n\n";
  json messages = json::array({{{"role", "system"}, {"content", system}},
                               {{"role", "user"}, {"content", "Fix the failing tests in the parser module. " + g.prose(120)}}});
  auto render = [&](const json& msgs) {
    return model->encode(model->render_chat({{"messages", msgs}, {"tools", tools}, {"add_generation_prompt", true}}));
  };
  struct Prompt {
    uint32_t turn, variant;
    std::vector<int32_t> ids;
  };
  std::vector<Prompt> prompts;
  for (int turn = 0;; ++turn) {
    auto ids = render(messages);
    std::fprintf(stderr, "turn %d: %zu tokens\n", turn, ids.size());
    const bool last = ids.size() >= min_tokens && turn + 1 >= min_turns;
    if (!last) {
      prompts.push_back({static_cast<uint32_t>(turn), 0, std::move(ids)});
      auto [a, t] = step(g, turn);
      messages.push_back(a);
      messages.push_back(t);
      continue;
    }
    // The last turn: `variants` versions of the step before it (messages end with that step).
    const json before = json(std::vector<json>(messages.begin(), messages.end() - 2));
    for (int v = 0; v < variants; ++v) {
      json m = before;
      json a = messages[messages.size() - 2], t = messages[messages.size() - 1];
      if (v > 0) {  // the same step with other words of the same lengths (variant 0: as generated)
        Gen gv(7000 + static_cast<unsigned>(v));
        const std::size_t rl = a["reasoning_content"].get<std::string>().size(), tl = t["content"].get<std::string>().size();
        std::string r = gv.prose(static_cast<int>(rl / 4) + 8), c = gv.file(static_cast<int>(tl) + 64, "variant");
        a["reasoning_content"] = r.substr(0, std::min(r.size(), rl));
        t["content"] = c.substr(0, tl);
      }
      m.push_back(a);
      m.push_back(t);
      prompts.push_back({static_cast<uint32_t>(turn), static_cast<uint32_t>(v), render(m)});
      std::fprintf(stderr, "turn %d variant %d: %zu tokens\n", turn, v, prompts.back().ids.size());
    }
    break;
  }
  std::ofstream f(out, std::ios::binary);
  f.write("SDAL1\0\0\0", 8);
  const uint32_t n = static_cast<uint32_t>(prompts.size());
  f.write(reinterpret_cast<const char*>(&n), 4);
  for (const Prompt& p : prompts) {
    const uint32_t head[3] = {p.turn, p.variant, static_cast<uint32_t>(p.ids.size())};
    f.write(reinterpret_cast<const char*>(head), sizeof head);
    f.write(reinterpret_cast<const char*>(p.ids.data()), static_cast<std::streamsize>(p.ids.size() * sizeof(int32_t)));
  }
  if (!f) {
    std::fprintf(stderr, "could not write %s\n", out.c_str());
    return 1;
  }
  std::fprintf(stderr, "%u prompts written to %s\n", n, out.c_str());
  return 0;
}
