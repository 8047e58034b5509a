#include "gateway/tools/amnesia_probe.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <sstream>
#include <stdexcept>

#include "common/json_limits.hpp"
#include "gateway/tools/engine_calls.hpp"

namespace servedeck::tools {

using nlohmann::json;

json default_amnesia_conversation() {
  return json::array({
      {{"role", "system"}, {"content", "You are a coding agent working in the user's repository."}},
      {{"role", "user"}, {"content", "The build fails on main. Find the cause and fix it."}},
      {{"role", "assistant"},
       {"content", ""},
       {"reasoning_content", "The user wants the failing build fixed. I should look at the build log first."},
       {"tool_calls", json::array({{{"id", "call_1"}, {"type", "function"},
                                    {"function", {{"name", "read_file"}, {"arguments", "{\"path\":\"build.log\"}"}}}}})}},
      {{"role", "tool"}, {"tool_call_id", "call_1"},
       {"content", "src/net.cpp:41: error: 'timeout_ms' was not declared in this scope"}},
  });
}

json drop_reasoning(const json& messages) {
  json out = messages;
  for (auto& m : out) {
    if (m.is_object() && m.value("role", "") == "assistant") {
      m.erase("reasoning_content");
      m.erase("reasoning");
    }
  }
  return out;
}

namespace {

std::string normalise(std::string s) {
  std::size_t i = 0;
  while (i < s.size() && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n')) ++i;
  s = s.substr(i);
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

AmnesiaArm run_arm(const AmnesiaOptions& opt, const std::string& name, const json& messages,
                   const std::vector<int64_t>& continuation) {
  EngineAddress at{opt.host, opt.port, opt.timeout_ms};
  json tok = {{"model", opt.model}, {"messages", messages}, {"add_generation_prompt", true}};
  if (!opt.tools.empty()) tok["tools"] = opt.tools;
  std::vector<int64_t> prompt = tokenize(at, tok);
  prompt.insert(prompt.end(), continuation.begin(), continuation.end());
  json body = {{"model", opt.model}, {"prompt", prompt}, {"max_tokens", 1}, {"temperature", 0},
               {"logprobs", opt.top_logprobs}};
  json out = post_json(at, "/v1/completions", body);
  const json* top = nullptr;
  try {
    top = &out.at("choices").at(0).at("logprobs").at("top_logprobs").at(0);
  } catch (const json::exception&) {
    throw std::runtime_error("POST /v1/completions: expected choices[0].logprobs.top_logprobs[0], got " +
                             dump_safe(out).substr(0, 300));
  }
  AmnesiaArm arm;
  arm.name = name;
  arm.prompt_tokens = static_cast<int>(prompt.size());
  for (const auto& [text, lp] : top->items()) {
    if (!lp.is_number()) continue;
    double p = std::exp(lp.get<double>());
    arm.top.emplace_back(text, p);
    std::string key = normalise(text);
    if (std::find(opt.greeting_tokens.begin(), opt.greeting_tokens.end(), key) != opt.greeting_tokens.end())
      arm.amnesia_mass += p;
  }
  std::sort(arm.top.begin(), arm.top.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
  return arm;
}

}  // namespace

AmnesiaReport run_amnesia_probe(const AmnesiaOptions& opt) {
  EngineAddress at{opt.host, opt.port, opt.timeout_ms};
  std::vector<int64_t> continuation =
      tokenize(at, {{"model", opt.model}, {"prompt", opt.continuation}, {"add_special_tokens", false}});
  AmnesiaReport r;
  r.dropped = run_arm(opt, "reasoning dropped", drop_reasoning(opt.messages), continuation);
  r.restored = run_arm(opt, "reasoning restored", opt.messages, continuation);
  return r;
}

std::string AmnesiaReport::table() const {
  std::ostringstream out;
  char line[200];
  std::snprintf(line, sizeof line, "%-20s %13s %14s  %s\n", "arm", "prompt_tokens", "amnesia_mass", "top continuations");
  out << line;
  for (const AmnesiaArm* arm : {&dropped, &restored}) {
    std::snprintf(line, sizeof line, "%-20s %13d %13.2f%%  ", arm->name.c_str(), arm->prompt_tokens, 100.0 * arm->amnesia_mass);
    out << line;
    for (std::size_t i = 0; i < arm->top.size() && i < 5; ++i) {
      std::snprintf(line, sizeof line, "%s%s %.1f%%", i ? ", " : "", dump_safe(json(arm->top[i].first)).c_str(),
                    100.0 * arm->top[i].second);
      out << line;
    }
    out << "\n";
  }
  return out.str();
}

json AmnesiaReport::to_json() const {
  auto arm_json = [](const AmnesiaArm& a) {
    json top = json::array();
    for (const auto& [t, p] : a.top) top.push_back({{"token", t}, {"p", p}});
    return json{{"name", a.name}, {"prompt_tokens", a.prompt_tokens}, {"amnesia_mass", a.amnesia_mass}, {"top", top}};
  };
  return {{"dropped", arm_json(dropped)}, {"restored", arm_json(restored)}};
}

}  // namespace servedeck::tools
