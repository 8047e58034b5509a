// The gateway's Anthropic Messages routes (the bridge itself is gateway/anthropic/):
//   POST /v1/messages               translated onto a chat completion and run through the same
//                                   path as /v1/chat/completions (routing, queueing, policies,
//                                   deadlines, request log), answered through MessagesResponder;
//   POST /v1/messages/count_tokens  {"input_tokens": N}: the same translation, counted by the
//                                   engine's /tokenize with the model's own template when the
//                                   model is running on an engine that has one; otherwise
//                                   estimated and flagged ("servedeck_estimated": true).
// Errors answer in Anthropic's envelope with the status's type: a body that is no Messages
// request 400 invalid_request_error, an unknown model 404 not_found_error. docs/anthropic.md.
//
// Thread-safety: the handlers run on an I/O thread and return at once.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "common/http/server.hpp"
#include "gateway/server/proxy.hpp"
#include "gateway/supervisor/slot_control.hpp"
#include "registry/model_entry.hpp"

namespace servedeck::gateway {

/// What the routes need from the gateway.
struct MessagesRoutes {
  const registry::Registry* reg = nullptr;
  SlotControl* slots = nullptr;
  ProxyShared* shared = nullptr;
  /// Runs a translated chat completion body like a /v1/chat/completions request (the gateway's
  /// handle_completion_body with Route::messages), answering through `res`.
  std::function<void(nlohmann::json chat, std::shared_ptr<http::Responder> res, std::chrono::steady_clock::time_point t0)>
      run_chat;
};

/// True for /v1/messages and the paths below it: their errors use Anthropic's envelope.
bool is_messages_path(std::string_view path);

/// Anthropic's error envelope with the type error_type_for_status(status).
void send_messages_error(http::Responder& res, int status, const std::string& message, http::Headers extra = {});

void handle_messages(const MessagesRoutes& routes, const http::Request& req, std::shared_ptr<http::Responder> res);
void handle_count_tokens(const MessagesRoutes& routes, const http::Request& req, std::shared_ptr<http::Responder> res);

}  // namespace servedeck::gateway
