// Effort presets and reasoning-effort mapping (issue 7 §1; seed notes, "Client compatibility").
//
// - A preset alias (e.g. "glm53-flash-low") merges its chat_template_kwargs into the request as
//   gap-filling defaults: keys the client sent explicitly win. The bare id keeps the model's
//   default (nothing is added).
// - A top-level `reasoning_effort` is moved into chat_template_kwargs.reasoning_effort (where
//   the template reads it; the client's explicit kwarg wins) and removed from the top level.
// - chat_template_kwargs.reasoning_effort is mapped onto PolicyConfig::accepted_reasoning_efforts
//   when that list is set: GLM's template turns any value it does not know into unbounded "max"
//   thinking, so an unaccepted value is never forwarded raw. Counted as "effort_presets".
// - Responses echo the id the client used (`model` of every body and chunk).
#pragma once

#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "policies/pipeline.hpp"

namespace servedeck::policies {

/// The accepted value `requested` maps to: itself when accepted; else the accepted value nearest
/// on the scale none < minimal < low < medium < high < xhigh < max (ties → the higher); a value
/// off that scale → default_reasoning_effort when set and accepted, else the first accepted value.
/// Returns `requested` unchanged when no accepted list is configured.
std::string map_reasoning_effort(std::string_view requested, const registry::PolicyConfig& config);

/// Request side: top-level reasoning_effort → kwargs, preset merge, mapping. Never fails.
void apply_effort_presets(nlohmann::json& body, RequestContext& ctx);

/// Response side: sets `model` to `requested_id` on a body or chunk (no-op when empty).
void echo_requested_model(nlohmann::json& body_or_chunk, const std::string& requested_id);

}  // namespace servedeck::policies
