// thinking_token_budget (issue 7 §9). Engines that support a per-request thinking budget
// (PolicyConfig::thinking_token_budget; the vLLM fork's sampler forces the think-end token when it
// is spent; the native worker will) get it forwarded; for others it is removed (and logged), so
// an engine that rejects unknown fields never sees it.
//
// Default when the client sent none and the engine supports it: a preset's
// EffortPreset::thinking_token_budget (the preset's cap C, tokens), or the model-wide cap
// PolicyConfig::extra["thinking_token_budget"]["default_max"]; the value is
// min(C, 75% of the stated output budget) when a budget is stated, else C. The figure follows
// the retired effort proxy, which defaulted to min(10,000, 75% of a stated output budget)
// (seed notes). The stated budget is read after min_output_tokens has raised it.
// Not a repair: nothing is counted.
#pragma once

#include <cstdint>
#include <optional>

#include <nlohmann/json.hpp>

#include "policies/pipeline.hpp"

namespace servedeck::policies {

/// min(cap, 75% of budget) when a budget is given, else cap; tokens.
int64_t default_thinking_budget(int64_t cap, std::optional<int64_t> output_budget);

/// Request side. Never fails.
void apply_thinking_token_budget(nlohmann::json& body, RequestContext& ctx);

}  // namespace servedeck::policies
