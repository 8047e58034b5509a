// What the two generation routes (/v1/chat/completions, /v1/completions) share per request:
// the client's Responder, the engine's request handle, the response envelope, and the parts of
// the stream that do not depend on the route's shapes: a lazily started stream, chunk writes that
// cancel the generation once the client is gone, the cancelled and failed endings, and the
// closing usage chunk + [DONE].
//
// Streams start lazily at the first token, so a failure before any token is a plain HTTP error;
// a failure after it is an SSE error event and no [DONE] (never a 200 with an empty stream).
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "common/http/server.hpp"
#include "worker/engine/engine.hpp"
#include "worker/server/metrics.hpp"
#include "worker/server/openai_format.hpp"
#include "worker/server/request_params.hpp"
#include "worker/server/route_context.hpp"
#include "worker/server/text_model.hpp"

namespace servedeck::worker {

struct GenerationState {
  std::shared_ptr<http::Responder> res;
  const TextModel* text = nullptr;
  Metrics* metrics = nullptr;
  std::shared_ptr<RequestHandle> handle;
  std::string id;                  // "chatcmpl-…" / "cmpl-…"
  long long created = 0;           // unix seconds
  std::string model;               // the served model name
  CommonParams params;
  bool started = false;            // the SSE stream has begun (status 200 sent)
  const char* route = "";          // the metrics label: "chat" | "completions"
  const char* chunk_object = "";   // "chat.completion.chunk" | "text_completion"

  /// {id, object: chunk_object, created, model, choices}.
  nlohmann::json envelope(nlohmann::json choices) const;
  /// Writes one SSE data event; false (and the generation cancelled) when the client is gone.
  bool write(const nlohmann::json& j);
  /// Starts the stream once (status 200); false (and cancelled) when the client is gone.
  bool open_stream();
  /// Ends a cancelled (499, the client left) or failed (500, or an error event mid-stream)
  /// generation; returns false for any other result, which the route then answers itself.
  bool end_unfinished(const GenerationResult& r);
  /// After the finish chunk: the usage chunk when stream_options.include_usage, [DONE], end.
  void close_stream(const GenerationResult& r);
};

/// Parses `req`'s body as a JSON object for `route` (common/json_limits.hpp's parse_untrusted).
/// On failure answers 400 (nesting too deep; not JSON, naming the byte and the reason; not an
/// object; `expected` names the shape, e.g. {"model": ..., "prompt": ...}) and returns a
/// discarded value.
nlohmann::json parse_request_object(const RouteContext& ctx, const char* route, const http::Request& req,
                                    http::Responder& res, std::string_view expected);

/// Fills `state`'s common fields (responder, model, id with `id_prefix`, created), cancels the
/// generation when the client disconnects, and submits `gen` to the engine; the engine then
/// calls state->on_event and state->on_done (State derives from GenerationState).
template <class State>
void submit_generation(const RouteContext& ctx, std::shared_ptr<State> state, std::shared_ptr<http::Responder> res,
                       std::string_view id_prefix) {
  state->res = res;
  state->text = ctx.model.text.get();
  state->metrics = &ctx.metrics;
  state->handle = std::make_shared<RequestHandle>();
  state->id = make_response_id(id_prefix);
  state->created = unix_now();
  state->model = ctx.options.served_model_name;
  res->on_disconnect([h = state->handle] { h->cancel(); });
  ctx.model.engine->submit(
      std::move(state->params.gen), [state](const GenerationEvent& ev) { state->on_event(ev); },
      [state](const GenerationResult& r) { state->on_done(r); }, state->handle);
}

}  // namespace servedeck::worker
