// libFuzzer target: parses the input as a chat template and renders it with a small
// conversation context under tight limits. Any exception other than TemplateError /
// TemplateRaised, any crash, hang, leak or sanitizer report is a finding. Built only with
// clang (-fsanitize=fuzzer); registered as the ctest `fuzz_worker_template` (~20 s).
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "worker/template/chat_template.hpp"

using servedeck::worker::ChatTemplate;
using servedeck::worker::RenderLimits;
using servedeck::worker::TemplateError;
using servedeck::worker::TemplateRaised;

namespace {

const nlohmann::ordered_json& context() {
  static const auto ctx = nlohmann::ordered_json::parse(R"({
    "messages": [
      {"role": "system", "content": "sys"},
      {"role": "user", "content": "hi <think>x</think> there"},
      {"role": "assistant", "content": "", "reasoning_content": "r",
       "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": {"a": 1, "b": [true, null]}}},
                      {"type": "function", "function": {"name": "g", "arguments": "{\"x\": 2}"}}]},
      {"role": "tool", "content": "out"},
      {"role": "assistant", "content": null}
    ],
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
    "add_generation_prompt": true, "enable_thinking": false, "bos_token": "<s>", "n": 3, "f": 1.5
  })");
  return ctx;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view source(reinterpret_cast<const char*>(data), size);
  RenderLimits limits;
  limits.max_steps = 200000;
  limits.max_string_bytes = 1 << 20;
  limits.max_call_depth = 40;
  try {
    const ChatTemplate t = ChatTemplate::parse(source);
    (void)t.render(context(), limits);
  } catch (const TemplateError&) {
  } catch (const TemplateRaised&) {
  }
  return 0;
}
