// request_cleanup (field case G12): fields some engines reject in requests OpenAI clients send.
// Enabled by PolicyConfig::extra["request_cleanup"] (true, or an object of options). Counted as
// "request_cleanup" once per request that changed.
//   - echoed assistant messages: `refusal`, `audio`, `function_call` and `tool_calls` that are null
//     (or an empty tool_calls array) are dropped;
//   - tools[]: only `type` and `function` are kept; inside `function` only name, description,
//     parameters, strict (vendor keys such as `cache_control` or `defer_loading` are dropped);
//   - a function without `parameters` gets {"type":"object","properties":{}};
//   - options object: "drop_top_level": ["stream_options", ...] removes those request keys
//     (the gateway synthesises the usage chunk when the engine cannot).
#pragma once

#include <nlohmann/json.hpp>

#include "policies/pipeline.hpp"

namespace servedeck::policies {

/// Whether the model enables request_cleanup.
bool request_cleanup_enabled(const registry::PolicyConfig& config);

/// Request side. Never fails.
void apply_request_cleanup(nlohmann::json& body, RequestContext& ctx);

}  // namespace servedeck::policies
