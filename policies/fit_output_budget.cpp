#include "policies/fit_output_budget.hpp"

#include <algorithm>

#include "policies/json_util.hpp"
#include "policies/repair_count.hpp"
#include "policies/token_math.hpp"

namespace servedeck::policies {
namespace {

using json = nlohmann::json;

constexpr const char* kBudgetKeys[] = {"max_tokens", "max_completion_tokens"};

}  // namespace

int64_t prompt_tokens_upper_bound(const json& body) {
  if (!body.is_object()) return 0;
  int64_t bytes = 0, messages = 0;
  if (auto m = body.find("messages"); m != body.end()) {
    bytes += static_cast<int64_t>(dump_safe(*m).size());
    if (m->is_array()) messages = static_cast<int64_t>(m->size());
  }
  if (auto t = body.find("tools"); t != body.end()) bytes += static_cast<int64_t>(dump_safe(*t).size());
  return bytes + 16 * messages + 512;
}

bool budget_may_overflow(const json& body, int64_t ctx) {
  if (!body.is_object() || ctx <= 0) return false;
  for (const char* k : kBudgetKeys) {
    auto it = body.find(k);
    if (it != body.end() && it->is_number_integer() &&
        saturating_add(integer_tokens(*it), prompt_tokens_upper_bound(body)) > ctx)
      return true;
  }
  return false;
}

int64_t fitted_budget(int64_t budget, int64_t floor, int64_t ctx, int64_t prompt_tokens) {
  return std::min(budget, std::max(floor, saturating_sub(ctx, prompt_tokens)));
}

void apply_fit_output_budget(json& body, RequestContext& ctx) {
  if (!ctx.model || !ctx.model->policies.fit_output_budget || !body.is_object() || ctx.model->ctx <= 0) return;
  if (!ctx.prompt_tokens) return;  // nothing counted: budget_may_overflow said it fits
  const int64_t floor = ctx.model->policies.fit_output_budget_floor;
  std::string note;
  for (const char* k : kBudgetKeys) {
    auto it = body.find(k);
    if (it == body.end() || !it->is_number_integer()) continue;
    const int64_t budget = integer_tokens(*it);
    const int64_t fitted = fitted_budget(budget, floor, ctx.model->ctx, *ctx.prompt_tokens);
    if (fitted >= budget) continue;
    *it = fitted;
    count_repair(ctx, "fit_output_budget");
    const std::string line = std::string(k) + " " + std::to_string(budget) + " -> " + std::to_string(fitted) +
                             " (ctx " + std::to_string(ctx.model->ctx) + ", prompt " +
                             std::to_string(*ctx.prompt_tokens) + " tokens " +
                             (ctx.prompt_tokens_estimated ? "estimated" : "counted by the engine's /tokenize") +
                             ", floor " + std::to_string(floor) + ")";
    log_note(ctx, "fit_output_budget", line);
    note += (note.empty() ? "" : "; ") + line;
  }
  if (!note.empty()) ctx.response_headers.emplace_back(k_output_budget_header, note);
}

}  // namespace servedeck::policies
