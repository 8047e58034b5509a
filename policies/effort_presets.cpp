#include "policies/effort_presets.hpp"

#include <algorithm>
#include <array>
#include <cstdlib>

#include "policies/repair_count.hpp"

namespace servedeck::policies {
namespace {

using json = nlohmann::json;

constexpr std::array<std::string_view, 7> kScale = {"none", "minimal", "low", "medium", "high", "xhigh", "max"};

int rank(std::string_view v) {
  for (std::size_t i = 0; i < kScale.size(); ++i) {
    if (kScale[i] == v) return static_cast<int>(i);
  }
  return -1;
}

bool accepted(std::string_view v, const registry::PolicyConfig& c) {
  return std::find(c.accepted_reasoning_efforts.begin(), c.accepted_reasoning_efforts.end(), v) !=
         c.accepted_reasoning_efforts.end();
}

}  // namespace

std::string map_reasoning_effort(std::string_view requested, const registry::PolicyConfig& c) {
  if (c.accepted_reasoning_efforts.empty() || accepted(requested, c)) return std::string(requested);
  int want = rank(requested);
  if (want >= 0) {
    std::string best;
    int best_dist = 1 << 20;
    for (const auto& a : c.accepted_reasoning_efforts) {
      int r = rank(a);
      if (r < 0) continue;
      int d = std::abs(r - want);
      // note: on a tie the higher value wins ("medium" between low and high → high): the client
      // asked for more than the lower one, and GLM's measured spread (low 183, high 484-713
      // reasoning tokens) makes high the closer budget.
      if (d < best_dist || (d == best_dist && r > rank(best))) {
        best_dist = d;
        best = a;
      }
    }
    if (!best.empty()) return best;
  }
  if (c.default_reasoning_effort && accepted(*c.default_reasoning_effort, c)) return *c.default_reasoning_effort;
  return c.accepted_reasoning_efforts.front();
}

void apply_effort_presets(json& body, RequestContext& ctx) {
  if (!body.is_object() || !ctx.model) return;
  const auto& config = ctx.model->policies;
  // Top-level reasoning_effort → kwargs (the template reads kwargs; the client's kwarg wins).
  if (body.contains("reasoning_effort") && !config.accepted_reasoning_efforts.empty()) {
    json effort = body["reasoning_effort"];
    body.erase("reasoning_effort");
    if (effort.is_string()) {
      if (!body.contains("chat_template_kwargs") || !body["chat_template_kwargs"].is_object()) {
        body["chat_template_kwargs"] = json::object();
      }
      auto& kw = body["chat_template_kwargs"];
      if (!kw.contains("reasoning_effort")) kw["reasoning_effort"] = effort;
    }
  }
  if (ctx.preset && ctx.preset->chat_template_kwargs.is_object() && !ctx.preset->chat_template_kwargs.empty()) {
    if (!body.contains("chat_template_kwargs") || !body["chat_template_kwargs"].is_object()) {
      body["chat_template_kwargs"] = json::object();
    }
    auto& kw = body["chat_template_kwargs"];
    for (auto it = ctx.preset->chat_template_kwargs.begin(); it != ctx.preset->chat_template_kwargs.end(); ++it) {
      if (!kw.contains(it.key())) kw[it.key()] = it.value();
    }
  }
  if (body.contains("chat_template_kwargs") && body["chat_template_kwargs"].is_object()) {
    auto& kw = body["chat_template_kwargs"];
    if (kw.contains("reasoning_effort") && !config.accepted_reasoning_efforts.empty()) {
      if (kw["reasoning_effort"].is_string()) {
        std::string requested = kw["reasoning_effort"].get<std::string>();
        std::string mapped = map_reasoning_effort(requested, config);
        if (mapped != requested) {
          kw["reasoning_effort"] = mapped;
          count_repair(ctx, "effort_presets");
          log_note(ctx, "effort_presets", "reasoning_effort '" + requested + "' is not accepted by " +
                                              ctx.model->name + "; sent '" + mapped + "'");
        }
      } else {
        kw["reasoning_effort"] = map_reasoning_effort("", config);
        count_repair(ctx, "effort_presets");
        log_note(ctx, "effort_presets", "non-string reasoning_effort replaced");
      }
    }
  }
}

void echo_requested_model(json& body_or_chunk, const std::string& requested_id) {
  if (!requested_id.empty() && body_or_chunk.is_object()) body_or_chunk["model"] = requested_id;
}

}  // namespace servedeck::policies
