#include "policies/unsupported_kwargs.hpp"

#include "policies/json_util.hpp"
#include "policies/repair_count.hpp"

namespace servedeck::policies {
namespace {

using json = nlohmann::json;

bool asks_for_less(const json& v) {
  if (v.is_null()) return true;
  if (v.is_boolean()) return !v.get<bool>();
  if (v.is_number()) return v.get<double>() == 0.0;
  if (v.is_string()) {
    const auto& s = v.get_ref<const std::string&>();
    return s == "none" || s == "off" || s == "false" || s == "disabled" || s.empty();
  }
  return false;
}

}  // namespace

void apply_unsupported_kwargs(json& body, RequestContext& ctx) {
  if (!ctx.model || !body.is_object() || ctx.model->policies.unsupported_kwargs.empty()) return;
  if (!body.contains("chat_template_kwargs") || !body["chat_template_kwargs"].is_object()) return;
  auto& kw = body["chat_template_kwargs"];
  const auto& config = ctx.model->policies;
  for (const auto& key : config.unsupported_kwargs) {
    if (!kw.contains(key)) continue;
    json value = kw[key];
    kw.erase(key);
    count_repair(ctx, "unsupported_kwargs");
    std::string note = "chat_template_kwargs." + key + "=" + dump_safe(value) + " is ignored by " +
                       ctx.model->name + "'s template: removed";
    if (asks_for_less(value) && !config.accepted_reasoning_efforts.empty() && !kw.contains("reasoning_effort")) {
      kw["reasoning_effort"] = config.accepted_reasoning_efforts.front();
      note += ", reasoning_effort='" + config.accepted_reasoning_efforts.front() + "' (lowest accepted)";
    }
    log_note(ctx, "unsupported_kwargs", note);
  }
}

}  // namespace servedeck::policies
