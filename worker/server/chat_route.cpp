// POST /v1/chat/completions: template → engine → reasoning/tool-call parsers → OpenAI chat
// shapes, streamed (one SSE event per token delta, then a finish chunk, the usage chunk when
// stream_options.include_usage, and [DONE]) or whole.
// Stream start, endings and the usage chunk: generation_state.hpp. tool_choice "required" and
// named functions force the answer's start (tool_choice.hpp): the forced text is appended to the
// prompt tokens and fed to the parser ahead of the first generated piece, so its tool-call deltas
// come out exactly as for a model that wrote it (it is counted in prompt_tokens, not completion).
#include <mutex>

#include "common/json_limits.hpp"

#include "common/openai_error.hpp"
#include "common/sse.hpp"
#include "worker/parsers/output_parser.hpp"
#include "worker/server/chat_prompt.hpp"
#include "worker/server/generation_state.hpp"
#include "worker/server/openai_format.hpp"
#include "worker/server/request_params.hpp"
#include "worker/server/route_context.hpp"

namespace servedeck::worker {

namespace {

constexpr const char* k_route = "chat";

struct ChatState : GenerationState {
  std::unique_ptr<OutputParser> parser;
  std::string forced;  // tool_choice's forced answer start, fed to the parser before the first token
  ParsedOutput parsed;  // non-stream
  nlohmann::json logprobs_content = nlohmann::json::array();

  ChatState() {
    route = k_route;
    chunk_object = "chat.completion.chunk";
  }

  nlohmann::json chunk(nlohmann::json delta, nlohmann::json finish = nullptr, nlohmann::json logprobs = nullptr) const {
    return envelope(nlohmann::json::array({{{"index", 0}, {"delta", std::move(delta)}, {"logprobs", std::move(logprobs)},
                                            {"finish_reason", std::move(finish)}}}));
  }

  /// Starts the stream with the role chunk.
  bool start() {
    if (started) return true;
    return open_stream() && write(chunk({{"role", "assistant"}, {"content", ""}}));
  }

  static nlohmann::json delta_json(const ParseDelta& d) {
    switch (d.kind) {
      case DeltaKind::content: return {{"content", d.text}};
      case DeltaKind::reasoning: return {{"reasoning_content", d.text}};
      case DeltaKind::tool_call_start:
        return {{"tool_calls", nlohmann::json::array({{{"index", d.tool_index}, {"id", d.id}, {"type", "function"},
                                                       {"function", {{"name", d.name}, {"arguments", ""}}}}})}};
      case DeltaKind::tool_call_arguments:
        return {{"tool_calls", nlohmann::json::array({{{"index", d.tool_index}, {"function", {{"arguments", d.text}}}}})}};
    }
    return nlohmann::json::object();
  }

  // Streams `deltas`; `lp` (a chat logprobs object or null) rides on the first chunk.
  void stream_deltas(const std::vector<ParseDelta>& deltas, nlohmann::json lp) {
    if (deltas.empty() && lp.is_null()) return;
    if (!start()) return;
    if (deltas.empty()) {
      write(chunk(nlohmann::json::object(), nullptr, std::move(lp)));
      return;
    }
    for (const auto& d : deltas) {
      if (!write(chunk(delta_json(d), nullptr, std::move(lp)))) return;
      lp = nullptr;
    }
  }

  // The parser's input for a generated piece: the forced start first, once.
  std::string take_forced(std::string_view generated) {
    std::string t = std::move(forced);
    forced.clear();
    t += generated;
    return t;
  }

  void on_event(const GenerationEvent& ev) {
    auto deltas = parser->push(take_forced(ev.text));
    nlohmann::json entry;
    if (params.want_logprobs && ev.logprob) entry = chat_logprob_entry(*ev.logprob, *text, params.tokens_as_ids);
    if (params.stream) {
      nlohmann::json lp;
      if (!entry.is_null()) lp = {{"content", nlohmann::json::array({entry})}};
      stream_deltas(deltas, std::move(lp));
    } else {
      fold(deltas, parsed);
      if (!entry.is_null()) logprobs_content.push_back(std::move(entry));
    }
  }

  std::string finish_reason(const GenerationResult& r) const {
    if (r.finish == FinishReason::stop && parser->tool_calls() > 0) return "tool_calls";
    return std::string(api_finish_reason(r.finish));
  }

  void on_done(const GenerationResult& r) {
    if (end_unfinished(r)) return;
    auto tail = parser->push(take_forced({}));
    for (auto& d : parser->finish()) tail.push_back(std::move(d));
    metrics->count_request(k_route, 200);
    if (params.stream) {
      stream_deltas(tail, nullptr);
      if (!start()) return;
      write(chunk(nlohmann::json::object(), finish_reason(r)));
      close_stream(r);
      return;
    }
    fold(tail, parsed);
    nlohmann::json message = {{"role", "assistant"}};
    message["content"] = parsed.content.empty() && !parsed.tool_calls.empty() ? nlohmann::json(nullptr)
                                                                              : nlohmann::json(parsed.content);
    if (!parsed.reasoning.empty()) message["reasoning_content"] = parsed.reasoning;
    if (!parsed.tool_calls.empty()) {
      nlohmann::json calls = nlohmann::json::array();
      for (const auto& c : parsed.tool_calls)
        calls.push_back({{"id", c.id}, {"type", "function"}, {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
      message["tool_calls"] = std::move(calls);
    }
    nlohmann::json choice = {{"index", 0}, {"message", std::move(message)}, {"finish_reason", finish_reason(r)}};
    choice["logprobs"] = params.want_logprobs ? nlohmann::json{{"content", logprobs_content}} : nlohmann::json(nullptr);
    if (!r.stop_string.empty()) choice["stop_reason"] = r.stop_string;
    nlohmann::json body = {{"id", id}, {"object", "chat.completion"}, {"created", created}, {"model", model},
                           {"choices", nlohmann::json::array({std::move(choice)})}, {"usage", usage_json(r)}};
    if (params.gen.prompt_logprobs >= 0) body["prompt_logprobs"] = prompt_logprobs_json(r, *text, params.tokens_as_ids);
    res->send(200, "application/json", dump_json(body));
  }
};

}  // namespace

void handle_chat(const RouteContext& ctx, const http::Request& req, std::shared_ptr<http::Responder> res) {
  const auto body = parse_request_object(ctx, k_route, req, *res, "{\"model\": ..., \"messages\": [...]}");
  if (body.is_discarded()) return;
  auto state = std::make_shared<ChatState>();
  if (auto e = parse_common_params(body, ApiKind::chat, state->params, ctx.model.default_sampling))
    return reply_error(ctx, k_route, *res, 400, *e, "invalid_request_error", "invalid_parameter");
  ChatPrompt prompt;
  if (auto f = build_chat_prompt(body, *ctx.model.text, prompt))
    return reply_error(ctx, k_route, *res, f->status, f->message,
                       f->status == 400 ? "invalid_request_error" : "server_error", f->code, f->param);
  Engine& engine = *ctx.model.engine;
  const auto& eo = engine.options();
  const bool opens_reasoning = prompt_opens_reasoning(prompt.tokens, eo.think_start_id, eo.think_end_id);
  if (auto e = forced_tool_call_prefix(prompt.tool_choice, ctx.options.tool_parser, opens_reasoning, state->forced))
    return reply_error(ctx, k_route, *res, 400, e->message, "invalid_request_error", to_string(e->kind), "tool_choice");
  GenerationRequest& gen = state->params.gen;
  gen.prompt = std::move(prompt.tokens);
  if (!state->forced.empty()) {
    // note: encoded on its own, not with the rendered prompt, so the prompt's tokens stay the
    // template's and the prefix's are the ones the model would have sampled for that text.
    const auto forced_tokens = ctx.model.text->encode(state->forced);
    gen.prompt.insert(gen.prompt.end(), forced_tokens.begin(), forced_tokens.end());
  }
  if (!state->params.max_tokens_given) {
    const std::size_t room = std::min(ctx.model.max_model_len, engine.kv_capacity_tokens());
    // note: without this, engine.check() would answer "max_tokens is 0", a field the client never sent.
    if (gen.prompt.size() >= room)
      return reply_error(ctx, k_route, *res, 400,
                         "This model's maximum context length is " + std::to_string(ctx.model.max_model_len) +
                             " tokens (KV cache capacity " + std::to_string(engine.kv_capacity_tokens()) +
                             " tokens). However, your request has " + std::to_string(gen.prompt.size()) +
                             " input tokens, which leaves no room for output. Please reduce the length of the messages.",
                         "invalid_request_error", "context_length_exceeded");
    gen.max_tokens = room - gen.prompt.size();
    if (ctx.options.default_max_tokens > 0) gen.max_tokens = std::min(gen.max_tokens, ctx.options.default_max_tokens);
  }
  if (auto e = engine.check(gen.prompt.size(), gen.max_tokens))
    return reply_error(ctx, k_route, *res, 400, *e, "invalid_request_error", "context_length_exceeded");
  if (auto e = engine.check(gen.adjust))
    return reply_error(ctx, k_route, *res, 400, *e, "invalid_request_error", "invalid_parameter", "logit_bias");

  OutputParserOptions po;
  po.reasoning = ctx.options.reasoning_parser;
  po.starts_in_reasoning = opens_reasoning;  // the forced text (if any) is parsed as output
  po.tool_parser = prompt.tools_enabled ? ctx.options.tool_parser : ToolParserKind::none;
  po.tools = prompt.tools;
  state->parser = std::make_unique<OutputParser>(std::move(po));
  submit_generation(ctx, std::move(state), std::move(res), "chatcmpl-");
}

}  // namespace servedeck::worker
