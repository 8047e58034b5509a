// POST /v1/completions: a prompt given as text or token ids → engine → legacy completion shapes
// (text_completion objects; logprobs in the legacy tokens/token_logprobs/top_logprobs/text_offset
// form; vLLM's prompt_logprobs per choice). Streaming as in chat_route.cpp. echo is refused.
#include "common/openai_error.hpp"

#include "common/json_limits.hpp"
#include "common/sse.hpp"
#include "worker/server/generation_state.hpp"
#include "worker/server/openai_format.hpp"
#include "worker/server/request_params.hpp"
#include "worker/server/route_context.hpp"

namespace servedeck::worker {

namespace {

constexpr const char* k_route = "completions";

struct CompletionState : GenerationState {
  std::string output;            // non-stream
  std::size_t token_offset = 0;  // characters of token text so far, for text_offset
  nlohmann::json logprobs;       // legacy shape (non-stream accumulation)

  CompletionState() {
    route = k_route;
    chunk_object = "text_completion";
  }

  nlohmann::json chunk(std::string text_piece, nlohmann::json finish = nullptr, nlohmann::json lp = nullptr) const {
    return envelope(nlohmann::json::array({{{"index", 0}, {"text", std::move(text_piece)}, {"logprobs", std::move(lp)},
                                            {"finish_reason", std::move(finish)}}}));
  }

  bool start() { return open_stream(); }

  void on_event(const GenerationEvent& ev) {
    nlohmann::json lp;
    if (params.want_logprobs && ev.logprob) {
      append_completion_logprob(params.stream ? lp : logprobs, *ev.logprob, *text, token_offset, params.tokens_as_ids);
      token_offset += text->token_bytes(ev.token).size();
    }
    if (params.stream) {
      if (ev.text.empty() && lp.is_null()) return;
      if (start()) write(chunk(ev.text, nullptr, std::move(lp)));
    } else {
      output += ev.text;
    }
  }

  void on_done(const GenerationResult& r) {
    if (end_unfinished(r)) return;
    metrics->count_request(k_route, 200);
    const std::string reason(api_finish_reason(r.finish));
    if (params.stream) {
      if (!start()) return;
      write(chunk("", reason));
      close_stream(r);
      return;
    }
    nlohmann::json choice = {{"index", 0}, {"text", output}, {"finish_reason", reason},
                             {"logprobs", params.want_logprobs ? logprobs : nlohmann::json(nullptr)}};
    choice["stop_reason"] = r.stop_string.empty() ? nlohmann::json(nullptr) : nlohmann::json(r.stop_string);
    if (params.gen.prompt_logprobs >= 0) choice["prompt_logprobs"] = prompt_logprobs_json(r, *text, params.tokens_as_ids);
    nlohmann::json body = {{"id", id}, {"object", "text_completion"}, {"created", created}, {"model", model},
                           {"choices", nlohmann::json::array({std::move(choice)})}, {"usage", usage_json(r)}};
    res->send(200, "application/json", dump_json(body));
  }
};

// prompt: "text" | ["text"] | [ids...] | [[ids...]] → ids. Returns an error message or nullopt.
std::optional<std::string> read_prompt(const nlohmann::json& body, const TextModel& text, std::vector<int32_t>& out) {
  auto it = body.find("prompt");
  if (it == body.end()) return "field 'prompt' is missing; expected a string or an array of token ids";
  nlohmann::json p = *it;
  if (p.is_array() && p.size() == 1 && (p[0].is_string() || p[0].is_array())) p = p[0];
  if (p.is_array() && !p.empty() && (p[0].is_string() || p[0].is_array()))
    return "field 'prompt': expected one prompt per request (a string, an array of token ids, or a one-element array of "
           "either), got an array of " + std::to_string(p.size()) + " prompts";
  if (p.is_string()) {
    out = text.encode(p.get<std::string>());
    return std::nullopt;
  }
  if (p.is_array() && !p.empty()) {
    const auto vocab = static_cast<long long>(text.vocab_size());
    for (std::size_t i = 0; i < p.size(); ++i) {
      if (!p[i].is_number_integer() || p[i].get<long long>() < 0 || p[i].get<long long>() >= vocab)
        return "field 'prompt[" + std::to_string(i) + "]': expected a token id in [0, " + std::to_string(vocab) +
               "), got " + describe_value(p[i]);
      out.push_back(static_cast<int32_t>(p[i].get<long long>()));
    }
    return std::nullopt;
  }
  return "field 'prompt': expected a string, an array of token ids, or a one-element array of either "
         "(one prompt per request), got " + describe_value(*it);
}

}  // namespace

void handle_completions(const RouteContext& ctx, const http::Request& req, std::shared_ptr<http::Responder> res) {
  const auto body = parse_request_object(ctx, k_route, req, *res, "{\"model\": ..., \"prompt\": ...}");
  if (body.is_discarded()) return;
  if (auto e = body.find("echo"); e != body.end() && e->is_boolean() && e->get<bool>())
    return reply_error(ctx, k_route, *res, 400, "field 'echo': true is not supported by this engine; expected false or absent",
                       "invalid_request_error", "unsupported_parameter");
  auto state = std::make_shared<CompletionState>();
  if (auto e = parse_common_params(body, ApiKind::completions, state->params, ctx.model.default_sampling))
    return reply_error(ctx, k_route, *res, 400, *e, "invalid_request_error", "invalid_parameter");
  GenerationRequest& gen = state->params.gen;
  if (auto e = read_prompt(body, *ctx.model.text, gen.prompt))
    return reply_error(ctx, k_route, *res, 400, *e, "invalid_request_error", "invalid_prompt");
  Engine& engine = *ctx.model.engine;
  if (!state->params.max_tokens_given) gen.max_tokens = 16;  // the OpenAI completions default
  if (auto e = engine.check(gen.prompt.size(), gen.max_tokens))
    return reply_error(ctx, k_route, *res, 400, *e, "invalid_request_error", "context_length_exceeded");
  if (auto e = engine.check(gen.adjust))
    return reply_error(ctx, k_route, *res, 400, *e, "invalid_request_error", "invalid_parameter", "logit_bias");
  submit_generation(ctx, std::move(state), std::move(res), "cmpl-");
}

}  // namespace servedeck::worker
