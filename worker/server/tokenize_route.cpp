// POST /tokenize and POST /detokenize in vLLM's shapes:
//   /tokenize   {"model", "prompt"} or {"model", "messages", "tools"?, "chat_template_kwargs"?,
//               "add_generation_prompt"?} → {"count", "max_model_len", "tokens", "token_strs"}
//   /detokenize {"model", "tokens": [...]} → {"prompt": text}
#include "worker/server/chat_prompt.hpp"

#include "worker/server/generation_state.hpp"
#include "worker/server/openai_format.hpp"
#include "worker/server/request_params.hpp"
#include "worker/server/route_context.hpp"

namespace servedeck::worker {

void handle_tokenize(const RouteContext& ctx, const http::Request& req, std::shared_ptr<http::Responder> res) {
  const auto body = parse_request_object(ctx, "tokenize", req, *res, "{\"prompt\": \"...\"} or {\"messages\": [...]}");
  if (body.is_discarded()) return;
  std::vector<int32_t> tokens;
  if (body.contains("messages")) {
    ChatPrompt prompt;
    if (auto f = build_chat_prompt(body, *ctx.model.text, prompt))
      return reply_error(ctx, "tokenize", *res, f->status, f->message,
                         f->status == 400 ? "invalid_request_error" : "server_error", f->code, f->param);
    tokens = std::move(prompt.tokens);
  } else if (body.contains("prompt") && body["prompt"].is_string()) {
    tokens = ctx.model.text->encode(body["prompt"].get<std::string>());
  } else {
    return reply_error(ctx, "tokenize", *res, 400,
                       "expected field 'prompt' (a string) or 'messages' (an array), got " +
                           (body.contains("prompt") ? "prompt = " + describe_value(body["prompt"]) : std::string("neither")),
                       "invalid_request_error", "invalid_parameter");
  }
  bool want_strs = false;
  if (auto it = body.find("return_token_strs"); it != body.end() && !it->is_null()) {
    if (!it->is_boolean())
      return reply_error(ctx, "tokenize", *res, 400, "field 'return_token_strs': expected true or false, got " + describe_value(*it),
                         "invalid_request_error", "invalid_parameter");
    want_strs = it->get<bool>();
  }
  nlohmann::json out = {{"count", tokens.size()}, {"max_model_len", ctx.model.max_model_len}, {"tokens", tokens},
                        {"token_strs", nullptr}};
  if (want_strs) {
    nlohmann::json strs = nlohmann::json::array();
    for (int32_t t : tokens) strs.push_back(ctx.model.text->token_bytes(t));
    out["token_strs"] = std::move(strs);
  }
  ctx.metrics.count_request("tokenize", 200);
  res->send(200, "application/json", dump_json(out));
}

void handle_detokenize(const RouteContext& ctx, const http::Request& req, std::shared_ptr<http::Responder> res) {
  const auto body = parse_request_object(ctx, "detokenize", req, *res, "{\"tokens\": [ids...]}");
  if (body.is_discarded()) return;
  if (!body.contains("tokens") || !body["tokens"].is_array())
    return reply_error(ctx, "detokenize", *res, 400, "expected a JSON object {\"tokens\": [ids...]}, got " + describe_value(body),
                       "invalid_request_error", "invalid_parameter");
  std::vector<int32_t> ids;
  const auto& arr = body["tokens"];
  const auto vocab = static_cast<long long>(ctx.model.text->vocab_size());
  for (std::size_t i = 0; i < arr.size(); ++i) {
    if (!arr[i].is_number_integer() || arr[i].get<long long>() < 0 || arr[i].get<long long>() >= vocab)
      return reply_error(ctx, "detokenize", *res, 400,
                         "tokens[" + std::to_string(i) + "]: expected a token id in [0, " + std::to_string(vocab) +
                             "), got " + describe_value(arr[i]),
                         "invalid_request_error", "invalid_parameter");
    ids.push_back(static_cast<int32_t>(arr[i].get<long long>()));
  }
  std::string error;
  auto text = ctx.model.text->decode(ids, false, error);
  if (!text) return reply_error(ctx, "detokenize", *res, 400, error, "invalid_request_error", "invalid_parameter");
  ctx.metrics.count_request("detokenize", 200);
  res->send(200, "application/json", dump_json({{"prompt", *text}}));
}

}  // namespace servedeck::worker
