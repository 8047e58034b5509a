// libFuzzer target: the request pipeline (every policy on) on a hostile request.
//   input starting with '{': the whole request body (parsed with parse_untrusted);
//   otherwise: the text of an echoed assistant turn's tool-call `arguments` (the field failure:
//   the policies parse and re-serialise it), also its tool name up to the first '\n'.
// Invariants: fuzz_support.hpp; a body the pipeline accepts stays a JSON object with messages.
#include "policies/min_output_tokens.hpp"
#include "tests/policies/fuzz/fuzz_support.hpp"

using namespace servedeck;
using namespace servedeck::fuzz;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const registry::ModelEntry model = all_policies_model();
  static policies::ReasoningStore store;
  const std::string_view text = text_of(data, size);
  json body;
  if (!text.empty() && text.front() == '{') {
    body = parse_untrusted(text);
    if (body.is_discarded()) return 0;
  } else {
    std::size_t nl = text.find('\n');
    std::string name = nl == std::string_view::npos ? "read" : std::string(text.substr(0, nl));
    std::string args(nl == std::string_view::npos ? text : text.substr(nl + 1));
    body = tools_request();
    json turn = {{"role", "assistant"}, {"content", args},
                 {"tool_calls", json::array({{{"id", "call_1"}, {"type", "function"},
                                              {"function", {{"name", name}, {"arguments", args}}}}})}};
    store.remember(turn, "reasoning for " + args.substr(0, 16));  // restore_reasoning finds it again
    body["messages"].push_back(turn);
    body["messages"].push_back({{"role", "tool"}, {"tool_call_id", "call_1"}, {"content", args}});
    body["max_tokens"] = 200;
  }
  for (const char* requested : {"glm53-flash", "glm53-flash-low"}) {
    policies::RequestContext ctx;
    ctx.model = &model;
    ctx.requested_id = requested;
    ctx.preset = requested == std::string_view("glm53-flash-low") ? &model.presets[0] : nullptr;
    ctx.reasoning_store = &store;
    json b = body;
    policies::RequestPipeline p(ctx);
    if (p.wants_prompt_tokens(b)) {
      ctx.prompt_tokens = policies::estimate_prompt_tokens(b);
      ctx.prompt_tokens_estimated = true;
    }
    auto err = p.apply(b);
    check_budget(ctx.budget);
    if (!err) {
      if (!b.is_object()) __builtin_trap();
      check_sendable(b);
    }
  }
  return 0;
}
