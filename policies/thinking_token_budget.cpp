#include "policies/thinking_token_budget.hpp"

#include <algorithm>

#include "policies/repair_count.hpp"
#include "policies/token_math.hpp"

namespace servedeck::policies {

using json = nlohmann::json;

int64_t default_thinking_budget(int64_t cap, std::optional<int64_t> output_budget) {
  if (!output_budget) return cap;
  // 3/4 of the budget without forming 3 × budget (which overflows past INT64_MAX / 3).
  const int64_t b = *output_budget;
  return std::min(cap, b / 4 * 3 + b % 4 * 3 / 4);
}

void apply_thinking_token_budget(json& body, RequestContext& ctx) {
  if (!ctx.model || !body.is_object()) return;
  const auto& config = ctx.model->policies;
  if (!config.thinking_token_budget) {
    if (body.contains("thinking_token_budget")) {
      body.erase("thinking_token_budget");
      log_note(ctx, "thinking_token_budget", "removed: " + ctx.model->name + "'s engine does not support it");
    }
    return;
  }
  if (body.contains("thinking_token_budget")) return;
  std::optional<int64_t> cap;
  if (ctx.preset && ctx.preset->thinking_token_budget) cap = ctx.preset->thinking_token_budget;
  if (!cap && config.extra.is_object() && config.extra.contains("thinking_token_budget")) {
    const auto& t = config.extra["thinking_token_budget"];
    if (t.is_object() && t.contains("default_max") && t["default_max"].is_number_integer()) {
      cap = integer_tokens(t["default_max"]);
    }
  }
  if (!cap) return;
  std::optional<int64_t> budget;
  for (const char* k : {"max_completion_tokens", "max_tokens"}) {
    if (body.contains(k) && body[k].is_number_integer()) {
      budget = integer_tokens(body[k]);
      break;
    }
  }
  int64_t value = default_thinking_budget(*cap, budget);
  body["thinking_token_budget"] = value;
  log_note(ctx, "thinking_token_budget", "default " + std::to_string(value) + " tokens");
}

}  // namespace servedeck::policies
