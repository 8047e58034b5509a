// The Messages bridge's response side as an http::Responder: the gateway's chat-completions
// proxy writes its (normalised, policy-repaired) chat answer into this adapter, which turns it
// into the Anthropic Messages shape for the real client responder:
//   send(200, chat.completion)        → the message object (translate_completion); 502
//                                       api_error when a tool call's arguments are no JSON object
//   send(4xx/5xx, OpenAI envelope)    → the same status with Anthropic's envelope
//                                       {"type":"error","error":{"type","message"}}
//   start_stream + write(SSE chunks)  → message_start … message_stop, event by event
//   SSE comments (queue / prefill heartbeats) → `ping` events
//   an error event, or end() before [DONE] → an `error` event and no message_stop
//   a chat event over 64 MiB               → an `error` event and no message_stop (never dropped)
// Every answer carries a `request-id` header (Anthropic's, "req_<hex>").
//
// Thread-safety: like any Responder; calls are serialised by an internal mutex.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <string>

#include <nlohmann/json.hpp>

#include "common/http/server.hpp"
#include "common/sse.hpp"
#include "gateway/anthropic/request_translator.hpp"
#include "gateway/anthropic/stream_translator.hpp"

namespace servedeck::gateway::anthropic {

/// Anthropic's error body for an OpenAI error envelope `openai_body` (the gateway's or an
/// engine's) answered with HTTP `status`: the type follows the status (error_type_for_status),
/// except that a missing model (code model_not_found) is not_found_error whatever the status.
/// A body that is not an envelope becomes the message itself (first 2,000 bytes).
nlohmann::json error_from_openai(int status, const std::string& openai_body);

class MessagesResponder : public http::Responder {
 public:
  MessagesResponder(std::shared_ptr<http::Responder> client, std::shared_ptr<const TranslatedRequest> request,
                    std::string requested_model);

  void send(int status, std::string content_type, std::string body, http::Headers extra_headers = {}) override;
  bool start_stream(int status, std::string content_type = "text/event-stream", http::Headers extra_headers = {}) override;
  bool write(std::string_view bytes) override;
  void end() override;
  bool client_gone() const override { return client_->client_gone(); }
  void on_disconnect(std::function<void()> cb) override { client_->on_disconnect(std::move(cb)); }
  std::size_t queued_bytes() const override { return client_->queued_bytes(); }
  void when_drained(std::size_t below, std::function<void()> cb) override { client_->when_drained(below, std::move(cb)); }
  Refusal refusal() const override;

 private:
  bool emit(const std::vector<StreamEvent>& events);

  std::shared_ptr<http::Responder> client_;
  std::shared_ptr<const TranslatedRequest> request_;
  std::string request_id_;
  std::string message_id_;
  std::string model_;
  StreamTranslator translator_;
  // note: as the Responses bridge: the proxy's chat events are bounded by the engine's (16 MiB)
  // plus what the policies join (a held tool call), so 64 MiB; a larger one fails the stream.
  sse::Parser parser_{64u * 1024 * 1024, sse::Parser::OnOverflow::stop};
  std::mutex mu_;
  bool streaming_ = false;
  bool ended_ = false;
  // Set when send() answered an error of its own; atomics, so the proxy reads them without mu_
  // (it may record from a disconnect callback while another thread writes).
  std::atomic<int> refused_status_{0};
  std::atomic<const char*> refused_code_{""};
};

}  // namespace servedeck::gateway::anthropic
