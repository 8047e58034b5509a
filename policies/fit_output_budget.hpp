// fit_output_budget: a stated output budget that cannot fit in the model's context is lowered to
// what does fit, so that agents that send one budget whatever the model (qwen-code, opencode and
// Claude Code send max_tokens 32,000; pi sends max_completion_tokens 16,384) work against a
// smaller context instead of getting the engine's 400 (prompt + budget > ctx): opencode then
// loops on compaction, pi exits 0 printing nothing.
//   - `max_tokens` and `max_completion_tokens`, each on its own;
//   - only ever lowered, to ctx − prompt tokens (the model's served `ctx`), never below the
//     floor (PolicyConfig::fit_output_budget_floor, tokens; default 256): with less room than
//     that the engine's refusal, naming both numbers, is the honest answer;
//   - a request without a budget, or whose budget fits, is untouched;
//   - needs the prompt's tokens (RequestContext::prompt_tokens): the gateway counts them with the
//     engine's /tokenize where the engine has one, else estimates them (estimate_prompt_tokens,
//     a ~2x overcount, so the lowered budget can only come out smaller than the room);
//   - says what it did in the response header `x-servedeck-output-budget` and counts
//     "fit_output_budget" (servedeck_policy_repairs_total).
// On by default (PolicyConfig::fit_output_budget). Runs after min_output_tokens.
#pragma once

#include <cstdint>

#include <nlohmann/json.hpp>

#include "policies/pipeline.hpp"

namespace servedeck::policies {

/// The response header that reports a lowered budget.
inline constexpr const char* k_output_budget_header = "x-servedeck-output-budget";

/// An upper bound of the prompt's tokens without a tokenizer: bytes of the serialised messages
/// and tools (a byte-level BPE token covers at least one byte) + 16 per message + 512 for the
/// template's own text. note: generous on purpose — it only decides whether counting is needed.
int64_t prompt_tokens_upper_bound(const nlohmann::json& body);

/// True when `body` states a budget that may not fit `ctx` (budget + upper bound > ctx): the
/// gateway should count the prompt.
bool budget_may_overflow(const nlohmann::json& body, int64_t ctx);

/// The fitted budget, tokens: min(budget, max(floor, ctx − prompt_tokens)).
int64_t fitted_budget(int64_t budget, int64_t floor, int64_t ctx, int64_t prompt_tokens);

/// Request side. Never fails.
void apply_fit_output_budget(nlohmann::json& body, RequestContext& ctx);

}  // namespace servedeck::policies
