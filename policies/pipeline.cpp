// RequestPipeline and ResponsePipeline (non-streaming). StreamPipeline is in stream_pipeline.cpp.
#include "policies/pipeline.hpp"

#include "policies/answer_rescue.hpp"
#include "policies/effort_presets.hpp"
#include "policies/fit_output_budget.hpp"
#include "policies/flatten_content.hpp"
#include "policies/json_util.hpp"
#include "policies/min_output_tokens.hpp"
#include "policies/reasoning_dialects.hpp"
#include "policies/repair_count.hpp"
#include "policies/request_cleanup.hpp"
#include "policies/restore_reasoning.hpp"
#include "policies/sanitize_tool_tags.hpp"
#include "policies/tag_markup.hpp"
#include "policies/thinking_token_budget.hpp"
#include "policies/tool_call_repair.hpp"
#include "policies/unsupported_kwargs.hpp"

namespace servedeck::policies {
namespace {

using json = nlohmann::json;

std::string arguments_text(const json& function) {
  if (!function.contains("arguments")) return {};
  const auto& a = function["arguments"];
  if (a.is_string()) return a.get<std::string>();
  if (a.is_null()) return {};
  return dump_safe(a);
}

// sanitize_tool_tags on the echoed history: assistant tool_calls in later requests, so a broken
// key never reaches the engine again. A call that cannot be re-split keeps its first key piece
// (the history is already the client's; the request must not fail for it).
void sanitize_history(json& body, RequestContext& ctx) {
  if (!ctx.model->policies.sanitize_tool_tags || !body.contains("messages") || !body["messages"].is_array()) return;
  auto tools = declared_tools(body);
  for (auto& m : body["messages"]) {
    if (!m.is_object() || string_field(m, "role") != "assistant" || !m.contains("tool_calls") ||
        !m["tool_calls"].is_array()) {
      continue;
    }
    for (auto& tc : m["tool_calls"]) {
      if (!tc.is_object() || !tc.contains("function") || !tc["function"].is_object()) continue;
      auto& f = tc["function"];
      bool repaired = false;
      if (f.contains("name") && f["name"].is_string()) {
        if (auto n = sanitize_tool_name(f["name"].get<std::string>())) {
          f["name"] = *n;
          repaired = true;
        }
      }
      const DeclaredTool* tool = f.contains("name") && f["name"].is_string()
                                     ? find_tool(tools, f["name"].get<std::string>(), &ctx.budget) : nullptr;
      std::string args = arguments_text(f);
      auto r = repair_arguments(args, tool, {.sanitize = true, .coerce = false, .allow_resplit = true, .budget = &ctx.budget});
      if (ctx.budget.exhausted()) return;
      if (r.error) {
        r = repair_arguments(args, tool, {.sanitize = true, .coerce = false, .allow_resplit = false, .budget = &ctx.budget});
      }
      if (ctx.budget.exhausted()) return;
      if (!r.error && r.sanitized) {
        f["arguments"] = r.text;
        repaired = true;
      }
      if (repaired) {
        count_repair(ctx, "sanitize_tool_tags");
        log_note(ctx, "sanitize_tool_tags", "repaired echoed tool call '" + string_field(f, "name") + "'");
      }
    }
  }
}

}  // namespace

RequestPipeline::RequestPipeline(RequestContext& ctx) : ctx_(ctx) {}

bool RequestPipeline::wants_prompt_tokens(const json& body) const {
  if (!ctx_.model) return false;
  const auto& config = ctx_.model->policies;
  return (config.min_output_tokens && budget_below_floor(body, *config.min_output_tokens)) ||
         (config.fit_output_budget && budget_may_overflow(body, ctx_.model->ctx));
}

std::optional<std::string> RequestPipeline::apply(json& body) {
  if (!ctx_.model) return "servedeck: no model resolved for this request (policies)";
  if (!body.is_object()) return "request body: expected a JSON object";
  if (body.contains("messages") && !body["messages"].is_array()) {
    return "request body: `messages` must be an array, got " + std::string(body["messages"].type_name());
  }
  if (body.contains("chat_template_kwargs") && !body["chat_template_kwargs"].is_object() &&
      !body["chat_template_kwargs"].is_null()) {
    return "request body: `chat_template_kwargs` must be an object, got " +
           std::string(body["chat_template_kwargs"].type_name());
  }
  ctx_.budget.grant(json_text_bytes(body));
  apply_reasoning_dialects(body, ctx_);
  apply_flatten_content(body, ctx_);
  apply_request_cleanup(body, ctx_);
  sanitize_history(body, ctx_);
  if (ctx_.budget.exhausted()) return ctx_.budget.message();
  apply_unsupported_kwargs(body, ctx_);
  apply_effort_presets(body, ctx_);
  apply_min_output_tokens(body, ctx_);
  apply_fit_output_budget(body, ctx_);
  apply_thinking_token_budget(body, ctx_);
  apply_restore_reasoning(body, ctx_);
  return std::nullopt;
}

ResponsePipeline::ResponsePipeline(ResponseContext& ctx) : ctx_(ctx) {}

std::optional<PolicyError> ResponsePipeline::apply_body(json& body) {
  if (!body.is_object()) return std::nullopt;
  echo_requested_model(body, ctx_.requested_id);
  if (!ctx_.model || !body.contains("choices") || !body["choices"].is_array()) return std::nullopt;
  const auto& config = ctx_.model->policies;
  const bool repair_on = tool_call_repair_enabled(config);
  const auto tools = declared_tools(ctx_.request);
  WorkBudget* budget = &ctx_.budget;
  budget->grant(json_text_bytes(body));
  auto spent = [&] { return PolicyError{budget->message(), std::string(k_work_budget_code)}; };

  for (auto& choice : body["choices"]) {
    if (!choice.is_object() || !choice.contains("message") || !choice["message"].is_object()) continue;
    json& msg = choice["message"];
    std::string finish = choice.contains("finish_reason") && choice["finish_reason"].is_string()
                             ? choice["finish_reason"].get<std::string>() : std::string();
    const bool had_reasoning = reasoning_of(msg).has_value();
    std::string reasoning = reasoning_of(msg).value_or("");
    const bool content_was_string = msg.contains("content") && msg["content"].is_string();
    std::string content = content_was_string ? msg["content"].get<std::string>() : std::string();
    const bool saw_think_close = content.find(markup::kThinkClose) != std::string::npos ||
                                 reasoning.find(markup::kThinkClose) != std::string::npos;

    if (config.answer_rescue && split_stray_think(content, reasoning)) count_repair(ctx_, "answer_rescue");

    json calls = msg.contains("tool_calls") && msg["tool_calls"].is_array() ? msg["tool_calls"] : json::array();
    for (auto& tc : calls) {
      if (!tc.is_object() || !tc.contains("function") || !tc["function"].is_object()) continue;
      json& f = tc["function"];
      std::string name = f.contains("name") && f["name"].is_string() ? f["name"].get<std::string>() : std::string();
      std::string args = arguments_text(f);
      const DeclaredTool* tool = nullptr;
      if (!tools.empty() && (repair_on || config.sanitize_tool_tags)) {
        auto res = resolve_tool_name(name, tools, config.sanitize_tool_tags, budget);
        if (budget->exhausted()) return spent();
        if (res.error) {
          if (repair_on) return PolicyError{"servedeck: " + *res.error, "tool_call_unknown_name"};
        } else {
          if (res.sanitized) count_repair(ctx_, "sanitize_tool_tags");
          tool = find_tool(tools, res.name, budget);
          if (res.split_param && repair_on) {
            args = arguments_after_split(args, *tool, *res.split_param, budget);
            count_repair(ctx_, "tool_call_repair");
          }
          name = res.name;
        }
      } else if (config.sanitize_tool_tags) {
        if (auto n = sanitize_tool_name(name)) {
          name = *n;
          count_repair(ctx_, "sanitize_tool_tags");
        }
      }
      auto r = repair_arguments(args, tool, {.sanitize = config.sanitize_tool_tags,
                                             .coerce = config.coerce_tool_argument_types && tool != nullptr,
                                             .allow_resplit = true,
                                             .budget = budget});
      if (budget->exhausted()) return spent();
      if (r.error) {
        return PolicyError{"servedeck: tool call '" + name + "' has corrupted arguments that cannot be repaired: " +
                               *r.error, "tool_call_unrecoverable"};
      }
      if (r.sanitized) count_repair(ctx_, "sanitize_tool_tags");
      if (r.coerced) count_repair(ctx_, "tool_call_repair");
      args = r.text;
      if (repair_on && tool && !tool->required().empty() && is_empty_arguments(args, budget)) {
        std::optional<RecoveredCall> rec = recover_call(content, tools, name, budget);
        if (rec) {
          content = remove_ranges(content, {*rec});
        } else {
          rec = recover_call(reasoning, tools, name, budget);
        }
        if (budget->exhausted()) return spent();
        if (!rec) {
          std::string req;
          for (const auto& q : tool->required()) req += (req.empty() ? "" : ", ") + q;
          return PolicyError{"servedeck: the engine called '" + name + "' with empty arguments, but it requires (" +
                                 req + ") and no raw tool-call text held them", "tool_call_unrecoverable"};
        }
        args = rec->arguments;
        count_repair(ctx_, "tool_call_repair");
      }
      f["name"] = name;
      f["arguments"] = args;
    }

    if (calls.empty() && !tools.empty() && (config.answer_rescue || (repair_on && finish == "tool_calls"))) {
      auto found = extract_calls(content, tools, budget);
      bool from_content = !found.empty();
      if (found.empty()) found = extract_calls(reasoning, tools, budget);
      if (budget->exhausted()) return spent();
      if (!found.empty()) {
        for (const auto& c : found) {
          calls.push_back({{"id", new_tool_call_id()}, {"type", "function"},
                           {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
        }
        if (from_content) content = remove_ranges(content, found);
        count_repair(ctx_, finish == "tool_calls" ? "tool_call_repair" : "answer_rescue");
        finish = "tool_calls";
        choice["finish_reason"] = finish;
      }
    }
    if (repair_on && finish == "tool_calls" && calls.empty()) {
      return PolicyError{"servedeck: the engine finished with tool_calls but returned no tool call, and none "
                         "could be recovered from its text", "tool_call_missing"};
    }
    if (config.answer_rescue && reasoning_is_the_answer(finish, !calls.empty(), content, reasoning, saw_think_close)) {
      content = reasoning;
      reasoning.clear();
      count_repair(ctx_, "answer_rescue");
    }

    if (!calls.empty()) msg["tool_calls"] = calls;
    if (content_was_string || !content.empty()) msg["content"] = content;
    if (!reasoning.empty()) {
      set_reasoning(msg, reasoning, config.mirror_content);
    } else if (had_reasoning) {
      erase_reasoning(msg);
    }
    if (config.restore_reasoning && ctx_.reasoning_store && !reasoning.empty()) {
      ctx_.reasoning_store->remember(msg, reasoning);
    }
  }
  return std::nullopt;
}

}  // namespace servedeck::policies
