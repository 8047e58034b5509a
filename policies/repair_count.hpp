// Small helpers shared by the policy files: counting a repair (the gateway exports the counter
// as servedeck_policy_repairs_total{policy,model}) and writing a log note.
#pragma once

#include <string>
#include <string_view>

#include "policies/pipeline.hpp"

namespace servedeck::policies {

/// Calls ctx.count_repair(policy, base model name) when both are set.
template <class Context>
void count_repair(const Context& ctx, std::string_view policy) {
  if (ctx.count_repair) ctx.count_repair(policy, ctx.model ? std::string_view(ctx.model->name) : std::string_view());
}

/// Appends "policy: message" to ctx.log (RequestContext only).
inline void log_note(RequestContext& ctx, std::string_view policy, std::string_view message) {
  ctx.log.push_back(std::string(policy) + ": " + std::string(message));
}

}  // namespace servedeck::policies
