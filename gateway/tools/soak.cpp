#include "gateway/tools/soak.hpp"

#include <chrono>
#include <cstdio>
#include <ostream>
#include <sstream>

#include "common/json_limits.hpp"
#include "gateway/tools/stream_reader.hpp"

namespace servedeck::tools {

using nlohmann::json;

json soak_tools(int n) {
  static const char* verbs[] = {"read", "write", "list", "search", "run", "edit", "delete", "move", "fetch", "diff"};
  static const char* nouns[] = {"file", "dir", "symbol", "test", "branch"};
  json tools = json::array();
  for (int i = 0; i < n; ++i) {
    std::string name = std::string(verbs[i % 10]) + "_" + nouns[(i / 10) % 5] + (i >= 50 ? "_" + std::to_string(i) : "");
    json props = {{"path", {{"type", "string"}, {"description", "Path relative to the workspace root"}}}};
    if (i % 3 == 0) props["line"] = {{"type", "integer"}, {"description", "1-based line number"}};
    if (i % 4 == 0) props["recursive"] = {{"type", "boolean"}};
    if (i % 5 == 0) props["patterns"] = {{"type", "array"}, {"items", {{"type", "string"}}}};
    tools.push_back({{"type", "function"},
                     {"function",
                      {{"name", name},
                       {"description", "Tool " + std::to_string(i) + ": " + verbs[i % 10] + " a " + nouns[(i / 10) % 5] +
                                           " in the workspace and return the result as text."},
                       {"parameters", {{"type", "object"}, {"properties", props}, {"required", json::array({"path"})}}}}}});
  }
  return tools;
}

namespace {

std::optional<int64_t> usage_count(const json& usage, const char* object, const char* field) {
  const json* at = &usage;
  if (object) {
    if (!usage.is_object() || !usage.contains(object)) return std::nullopt;
    at = &usage[object];
  }
  if (!at->is_object() || !at->contains(field) || !(*at)[field].is_number_integer()) return std::nullopt;
  return (*at)[field].get<int64_t>();
}

std::string count_text(const std::optional<int64_t>& n) { return n ? std::to_string(*n) : "-"; }

std::string tool_result_text(int turn, int bytes) {
  std::string out = "result of turn " + std::to_string(turn) + ":\n";
  const std::string line = "    int value = compute(index, offset); // synthetic tool output line\n";
  while (static_cast<int>(out.size()) < bytes) out += line;
  out.resize(static_cast<std::size_t>(bytes));
  return out;
}

}  // namespace

SoakReport run_soak(const SoakOptions& opt, std::ostream* progress) {
  SoakReport report;
  const json tools = soak_tools(opt.tools);
  json messages = json::array({
      {{"role", "system"}, {"content", "You are a coding agent. Use the tools to inspect and change the workspace."}},
      {{"role", "user"}, {"content", "Find where the request timeout is configured and raise it to 30 seconds."}},
  });
  const auto start = std::chrono::steady_clock::now();
  for (int turn = 1; turn <= opt.turns; ++turn) {
    if (std::chrono::steady_clock::now() - start > std::chrono::seconds(opt.time_limit_s)) {
      report.time_limit_hit = true;
      break;
    }
    json sent = messages;
    if (opt.cold_prefix) sent[0]["content"] = "[turn " + std::to_string(turn) + "] " + sent[0]["content"].get<std::string>();
    json body = {{"model", opt.model}, {"messages", sent}, {"tools", tools}, {"max_tokens", opt.max_tokens},
                 {"temperature", 0.7}, {"stream", true}, {"stream_options", {{"include_usage", true}}}};
    SoakTurn row;
    row.turn = turn;
    row.messages = messages.size();
    row.request_bytes = dump_safe(body).size();
    StreamedTurn t = read_chat_stream(opt.host, opt.port, "/v1/chat/completions", body, opt.gap_timeout_ms, opt.api_key);
    row.status = t.status;
    row.ok = t.complete;
    row.failure = t.failure;
    row.ttft_ms = t.ttft_ms;
    row.decode_tok_s = t.decode_tok_s();
    row.prompt_tokens = usage_count(t.usage, nullptr, "prompt_tokens");
    row.cached_tokens = usage_count(t.usage, "prompt_tokens_details", "cached_tokens");
    report.turns.push_back(row);
    if (progress) {
      char line[256];
      std::snprintf(line, sizeof line, "turn %3d  %-4s  HTTP %3d  ttft %8.1f ms  decode %7.1f tok/s  prompt %6s  cached %6s  %zu messages",
                    turn, row.ok ? "ok" : "FAIL", row.status, row.ttft_ms, row.decode_tok_s, count_text(row.prompt_tokens).c_str(),
                    count_text(row.cached_tokens).c_str(), row.messages);
      *progress << line << (row.ok ? "" : "  " + row.failure) << "\n" << std::flush;
    }
    if (!row.ok) {
      report.failed_turn = turn;
      break;  // the first failure ends the soak: nothing after an engine's death counts
    }
    ++report.ok_turns;
    // Regrow the conversation as an agent does: the assistant turn, then tool results or a nudge.
    json assistant = {{"role", "assistant"}, {"content", t.content}};
    if (!t.tool_calls.empty()) assistant["tool_calls"] = t.tool_calls;
    messages.push_back(assistant);
    if (!t.tool_calls.empty()) {
      for (const auto& call : t.tool_calls) {
        messages.push_back({{"role", "tool"}, {"tool_call_id", call.value("id", "")},
                            {"content", tool_result_text(turn, opt.tool_result_bytes)}});
      }
    } else {
      messages.push_back({{"role", "user"},
                          {"content", "Here is more context:\n" + tool_result_text(turn, opt.tool_result_bytes) +
                                          "\nContinue."}});
    }
  }
  return report;
}

std::string SoakReport::table() const {
  std::ostringstream out;
  out << "turn  status  ok    ttft_ms  decode_tok_s  prompt_tokens  cached_tokens  messages  failure\n";
  for (const auto& t : turns) {
    char line[200];
    std::snprintf(line, sizeof line, "%4d  %6d  %-4s %8.1f  %12.1f  %13s  %13s  %8zu  ", t.turn, t.status, t.ok ? "ok" : "FAIL",
                  t.ttft_ms, t.decode_tok_s, count_text(t.prompt_tokens).c_str(), count_text(t.cached_tokens).c_str(), t.messages);
    out << line << t.failure << "\n";
  }
  out << ok_turns << " ok";
  if (failed_turn) out << ", failed at turn " << *failed_turn;
  if (time_limit_hit) out << ", stopped at the time limit";
  out << "\n";
  return out.str();
}

json SoakReport::to_json() const {
  json rows = json::array();
  for (const auto& t : turns) {
    rows.push_back({{"turn", t.turn}, {"status", t.status}, {"ok", t.ok}, {"failure", t.failure},
                    {"ttft_ms", t.ttft_ms}, {"decode_tok_s", t.decode_tok_s},
                    {"prompt_tokens", t.prompt_tokens ? json(*t.prompt_tokens) : json(nullptr)},
                    {"cached_tokens", t.cached_tokens ? json(*t.cached_tokens) : json(nullptr)}, {"messages", t.messages}});
  }
  return {{"turns", rows}, {"ok_turns", ok_turns},
          {"failed_turn", failed_turn ? json(*failed_turn) : json(nullptr)}, {"time_limit_hit", time_limit_hit}};
}

}  // namespace servedeck::tools
