// libFuzzer target: the response pipeline (every policy on) and the gateway's body
// normalisation on a hostile non-streamed answer.
//   input starting with '{': the whole chat.completion body;
//   otherwise: "<name>\n<finish>\n<arguments>\n<content>" (missing parts empty), built into a
//   body with one tool call (none when the name is empty) and that content.
// Invariants: fuzz_support.hpp; an error carries a message and a code; a repaired body has every
// tool call's name and arguments as strings.
#include "gateway/server/stream_normalizer.hpp"
#include "tests/policies/fuzz/fuzz_support.hpp"

using namespace servedeck;
using namespace servedeck::fuzz;

namespace {

std::string_view take_line(std::string_view& rest) {
  std::size_t nl = rest.find('\n');
  std::string_view line = rest.substr(0, nl);
  rest = nl == std::string_view::npos ? std::string_view() : rest.substr(nl + 1);
  return line;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const registry::ModelEntry model = all_policies_model();
  static policies::ReasoningStore store;
  std::string_view text = text_of(data, size);
  json body;
  if (!text.empty() && text.front() == '{') {
    body = parse_untrusted(text);
    if (body.is_discarded()) return 0;
  } else {
    std::string name(take_line(text));
    std::string finish(take_line(text));
    std::string args(take_line(text));
    json message = {{"role", "assistant"}, {"content", std::string(text)}, {"reasoning_content", args}};
    if (!name.empty()) {
      message["tool_calls"] = json::array({{{"id", "call_1"}, {"type", "function"},
                                            {"function", {{"name", name}, {"arguments", args}}}}});
    }
    body = {{"id", "chatcmpl-fuzz"}, {"object", "chat.completion"},
            {"choices", json::array({{{"index", 0}, {"message", message}, {"finish_reason", finish}}})}};
  }
  policies::ResponseContext ctx{&model, "glm53-flash", tools_request(), nullptr, &store};
  policies::ResponsePipeline p(ctx);
  auto err = p.apply_body(body);
  check_budget(ctx.budget);
  if (err) {
    if (err->message.empty() || err->code.empty()) __builtin_trap();
    return 0;
  }
  check_sendable(body);
  if (body.is_object() && body.contains("choices") && body["choices"].is_array()) {
    for (const auto& c : body["choices"]) {
      if (!c.is_object() || !c.contains("message") || !c["message"].is_object()) continue;
      const auto& m = c["message"];
      if (!m.contains("tool_calls") || !m["tool_calls"].is_array()) continue;
      for (const auto& tc : m["tool_calls"]) {
        // the pipeline writes every call's name and arguments as strings
        if (tc.is_object() && tc.contains("function") && tc["function"].is_object() &&
            (!tc["function"]["arguments"].is_string() || !tc["function"]["name"].is_string()))
          __builtin_trap();
      }
    }
  }
  gateway::StreamNormalizer::normalize_body(body, "glm53-flash", "fuzz");
  gateway::StreamNormalizer::add_missing_usage(body, 10);
  check_sendable(body);
  return 0;
}
