// flatten_content (issue 7 §7). For models whose chat template needs string content,
// `tool`, `system` and `assistant` (and `developer`) messages whose content is an array of text
// parts ({"type":"text"|"input_text"|"output_text","text":...}) are joined into one string with
// "\n" between parts (as vLLM joins text parts). An array holding any non-text part is left
// alone. Enabled by PolicyConfig::flatten_content; counted as "flatten_content" per message.
#pragma once

#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "policies/pipeline.hpp"

namespace servedeck::policies {

/// The joined text of an array of text parts; nullopt when `content` is not such an array.
std::optional<std::string> join_text_parts(const nlohmann::json& content);

/// Request side. Never fails.
void apply_flatten_content(nlohmann::json& body, RequestContext& ctx);

}  // namespace servedeck::policies
