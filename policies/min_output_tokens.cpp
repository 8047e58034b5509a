#include "policies/min_output_tokens.hpp"

#include <algorithm>

#include "policies/json_util.hpp"
#include "policies/repair_count.hpp"
#include "policies/token_math.hpp"

namespace servedeck::policies {
namespace {

using json = nlohmann::json;

constexpr const char* kBudgetKeys[] = {"max_tokens", "max_completion_tokens"};

}  // namespace

bool budget_below_floor(const json& body, int64_t floor) {
  if (!body.is_object()) return false;
  for (const char* k : kBudgetKeys) {
    if (body.contains(k) && body[k].is_number_integer() && integer_tokens(body[k]) < floor) return true;
  }
  return false;
}

int64_t raised_budget(int64_t budget, int64_t floor, int64_t ctx, std::optional<int64_t> prompt_tokens) {
  int64_t target = floor;
  if (ctx > 0 && prompt_tokens) target = std::min(target, saturating_sub(ctx, *prompt_tokens));
  return std::max(budget, target);
}

void apply_min_output_tokens(json& body, RequestContext& ctx) {
  if (!ctx.model || !ctx.model->policies.min_output_tokens || !body.is_object()) return;
  const int64_t floor = *ctx.model->policies.min_output_tokens;
  for (const char* k : kBudgetKeys) {
    if (!body.contains(k) || !body[k].is_number_integer()) continue;
    int64_t budget = integer_tokens(body[k]);
    if (budget >= floor) continue;
    int64_t raised = raised_budget(budget, floor, ctx.model->ctx, ctx.prompt_tokens);
    std::string source;
    if (!ctx.prompt_tokens) {
      source = "prompt tokens unknown, not clamped";
    } else {
      source = "prompt " + std::to_string(*ctx.prompt_tokens) + " tokens" +
               (ctx.prompt_tokens_estimated ? " (estimated, /tokenize unavailable)" : " (from /tokenize)") +
               ", ctx " + std::to_string(ctx.model->ctx);
    }
    if (raised <= budget) {
      log_note(ctx, "min_output_tokens", std::string(k) + " " + std::to_string(budget) +
                                             " left as sent: no room above it (" + source + ")");
      continue;
    }
    body[k] = raised;
    count_repair(ctx, "min_output_tokens");
    log_note(ctx, "min_output_tokens",
             std::string(k) + " " + std::to_string(budget) + " → " + std::to_string(raised) + " (" + source + ")");
  }
}

int64_t estimate_prompt_tokens(const json& body) {
  if (!body.is_object()) return 0;
  int64_t bytes = 0, messages = 0;
  if (body.contains("messages")) {
    bytes += static_cast<int64_t>(dump_safe(body["messages"]).size());
    if (body["messages"].is_array()) messages = static_cast<int64_t>(body["messages"].size());
  }
  if (body.contains("tools")) bytes += static_cast<int64_t>(dump_safe(body["tools"]).size());
  return (bytes + 1) / 2 + 8 * messages;
}

}  // namespace servedeck::policies
