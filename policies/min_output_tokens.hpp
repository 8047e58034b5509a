// min_output_tokens (issue 7 §2; seed notes, "Client compatibility").
//
// Reasoning shares max_tokens with the answer, and GLM's template opens a <think> block before
// the model writes a word, so a small budget is spent thinking and the turn comes back empty
// (measured: max_tokens=200 → finish "length", content_len 0). The floor (8192 for GLM) raises
// `max_tokens` and `max_completion_tokens`:
//   - only ever upward (a budget at or above the floor is untouched);
//   - clamped so prompt_tokens + budget ≤ ctx (model's served context, tokens); a budget already
//     larger than what fits is left as the client sent it (never lowered);
//   - a request without a budget is left alone (it already has the whole remaining context).
// Prompt tokens come from the gateway (engine /tokenize on the same messages and tools, or
// estimate_prompt_tokens when that is unavailable; ctx.log says which). Counted as
// "min_output_tokens".
#pragma once

#include <cstdint>
#include <optional>

#include <nlohmann/json.hpp>

#include "policies/pipeline.hpp"

namespace servedeck::policies {

/// True when `body` states a budget below `floor` (so the prompt size is needed to clamp).
bool budget_below_floor(const nlohmann::json& body, int64_t floor);

/// The raised budget for a stated budget `budget`, tokens: max(budget, min(floor, ctx − prompt)).
/// `ctx` ≤ 0 or no prompt count: no clamp.
int64_t raised_budget(int64_t budget, int64_t floor, int64_t ctx, std::optional<int64_t> prompt_tokens);

/// Request side. Never fails.
void apply_min_output_tokens(nlohmann::json& body, RequestContext& ctx);

/// Conservative (high) prompt-size estimate for when /tokenize is unavailable: UTF-8 bytes of
/// the serialised `messages` and `tools` / 2, plus 8 per message. note: real text averages 3.5–4
/// bytes per token for English and code (Qwen3/GLM tokenizers), so this overestimates by ~2x,
/// which can only make the clamp smaller, never overflow the context.
int64_t estimate_prompt_tokens(const nlohmann::json& body);

}  // namespace servedeck::policies
