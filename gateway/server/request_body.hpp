// Request bodies on the gateway's request path: the engine-neutral clean-up of a chat request.
// (Parsing is common/json_limits.hpp's parse_untrusted.)
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace servedeck::gateway {

/// Engine-neutral clean-up of a /v1/chat/completions request (G12), in place:
///   - messages: optional fields that are null or empty (`refusal`, `audio`, `function_call`,
///     `tool_calls`, `name`) dropped;
///   - tools: each `{"type":"function","function":{name, description?, parameters, strict?}}`
///     keeps only those keys (vendor keys dropped), gets `type: "function"` and an empty object
///     schema `{"type":"object","properties":{}}` when it declares no parameters.
/// Returns the number of repairs made.
int clean_chat_request(nlohmann::json& body);

}  // namespace servedeck::gateway
