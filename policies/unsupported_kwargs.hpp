// unsupported_kwargs (field case G16). A chat_template_kwargs key listed in
// PolicyConfig::unsupported_kwargs is one the model's template ignores (e.g.
// `enable_thinking: false` for GLM 5.3, whose template always thinks). It is removed; when its
// value asks for less (false, 0, "none", "off", null) it is rewritten onto the lowest accepted effort:
// chat_template_kwargs.reasoning_effort = accepted_reasoning_efforts[0], unless the client set
// reasoning_effort explicitly. Counted as "unsupported_kwargs". Runs before effort presets, so
// the rewrite counts as the client's explicit choice and a preset does not override it.
#pragma once

#include <nlohmann/json.hpp>

#include "policies/pipeline.hpp"

namespace servedeck::policies {

/// Request side. Never fails.
void apply_unsupported_kwargs(nlohmann::json& body, RequestContext& ctx);

}  // namespace servedeck::policies
