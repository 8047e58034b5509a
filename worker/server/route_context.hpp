// What every route handler of the worker needs: the server's options, the loaded model and the
// metrics. Handlers run on the HTTP server's blocking pool; they answer through the Responder
// (at once, or later from the engine's scheduler thread for generation). No handler throws.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "common/http/server.hpp"
#include "worker/engine/backend.hpp"
#include "worker/engine/engine.hpp"
#include "worker/parsers/tool_call_parser.hpp"
#include "worker/server/metrics.hpp"
#include "worker/server/text_model.hpp"

namespace servedeck::worker {

/// A model ready to serve. Members are destroyed in reverse order: the engine (which cancels
/// its requests and joins its thread) before the backend and the text model it uses.
struct LoadedModel {
  std::string root;                  // checkpoint directory (for /v1/models "root")
  std::size_t max_model_len = 0;     // tokens, prompt + output
  std::shared_ptr<void> keep_alive;  // what the backend reads from (e.g. the Checkpoint's mmap)
  /// Sampling used for fields a request omits: generation_config.json's temperature, top_p and
  /// top_k (vLLM's --generation-config auto), else OpenAI's defaults (1, 1, all).
  SamplingParams default_sampling;
  std::unique_ptr<TextModel> text;
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Engine> engine;
  /// What the load noticed and did not refuse (a missing hot-expert profile, a VRAM budget that
  /// cut the hot cache, options the backend ignores): servedeck-worker prints each on stderr,
  /// "servedeck-worker: warning: ...", once the model is loaded.
  std::vector<std::string> warnings;
};

struct WorkerServerOptions {
  std::string host = "127.0.0.1";
  int port = 0;                      // 0 → ephemeral; WorkerServer::port() tells which
  std::string served_model_name = "model";
  ToolParserKind tool_parser = ToolParserKind::hermes;
  bool reasoning_parser = true;      // --reasoning-parser qwen3 (true) | none
  int http_threads = 2;
  /// Chat output budget when a request names none; 0 = the rest of the context (vLLM's rule).
  /// note: a random-initialised model rarely samples EOS, so the tiny model's registry entry
  /// sets a small default and agents that send no budget still get short answers.
  std::size_t default_max_tokens = 0;
};

struct RouteContext {
  const WorkerServerOptions& options;
  LoadedModel& model;
  Metrics& metrics;
};

/// Sends an OpenAI error envelope and counts it. `type` per OpenAI ("invalid_request_error",
/// "server_error"); `param` names the request field at fault ("" → null); the error is marked as
/// produced by the engine.
void reply_error(const RouteContext& ctx, const std::string& route, http::Responder& res, int status,
                 std::string_view message, std::string_view type, std::string_view code,
                 std::string_view param = {});

/// POST /v1/chat/completions
void handle_chat(const RouteContext& ctx, const http::Request& req, std::shared_ptr<http::Responder> res);
/// POST /v1/completions
void handle_completions(const RouteContext& ctx, const http::Request& req, std::shared_ptr<http::Responder> res);
/// POST /tokenize
void handle_tokenize(const RouteContext& ctx, const http::Request& req, std::shared_ptr<http::Responder> res);
/// POST /detokenize
void handle_detokenize(const RouteContext& ctx, const http::Request& req, std::shared_ptr<http::Responder> res);

}  // namespace servedeck::worker
