// The Responses bridge's response side as an http::Responder: the gateway's chat-completions
// proxy writes its (normalised, policy-repaired) chat answer into this adapter, which turns it
// into the Responses API shape for the real client responder:
//   send(200, chat.completion)      → the response object (translate_completion)
//   send(4xx/5xx, error envelope)   → passed through unchanged (same envelope)
//   start_stream + write(SSE chunks) → response.created … response.completed, event by event
//   an error event, or end() before [DONE] → response.failed with the cause (field case G32)
// SSE comments (heartbeats while queued) pass through. When the request asked for `store`, the
// finished turn (its chat messages plus the assistant output) is kept in the state store under
// the response id for previous_response_id.
//
// Thread-safety: like any Responder, methods may be called from any thread; calls are
// serialised by an internal mutex (the proxy calls it from one strand anyway).
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include <nlohmann/json.hpp>

#include "common/http/server.hpp"
#include "common/sse.hpp"
#include "gateway/responses/request_translator.hpp"
#include "gateway/responses/stream_translator.hpp"

namespace servedeck::gateway::responses {

/// Called once with (response id, messages of the finished turn) when the response completed
/// and `store` was requested. May be empty.
using StoreTurn = std::function<void(const std::string& response_id, const nlohmann::json& messages)>;

class ResponsesResponder : public http::Responder {
 public:
  /// `request` must outlive the responder (the gateway keeps it in the same shared state).
  ResponsesResponder(std::shared_ptr<http::Responder> client, std::shared_ptr<const TranslatedRequest> request,
                     std::string requested_model, StoreTurn store_turn);

  void send(int status, std::string content_type, std::string body, http::Headers extra_headers = {}) override;
  bool start_stream(int status, std::string content_type = "text/event-stream", http::Headers extra_headers = {}) override;
  bool write(std::string_view bytes) override;
  void end() override;
  bool client_gone() const override { return client_->client_gone(); }
  void on_disconnect(std::function<void()> cb) override { client_->on_disconnect(std::move(cb)); }
  std::size_t queued_bytes() const override { return client_->queued_bytes(); }
  void when_drained(std::size_t below, std::function<void()> cb) override { client_->when_drained(below, std::move(cb)); }
  Refusal refusal() const override;

  const std::string& response_id() const { return id_; }

 private:
  bool emit(const std::vector<StreamEvent>& events);
  void store_if_completed();

  std::shared_ptr<http::Responder> client_;
  std::shared_ptr<const TranslatedRequest> request_;
  std::string id_;
  StreamTranslator translator_;
  StoreTurn store_turn_;
  // note: the gateway's own events, one per write; a policy may join a call's argument deltas
  // into one (G07), so the bound is the non-streamed body's (64 MiB), and an event over it ends
  // the response as failed instead of being dropped.
  sse::Parser parser_{64u * 1024 * 1024, sse::Parser::OnOverflow::stop};
  std::mutex mu_;
  bool streaming_ = false;
  bool ended_ = false;
  // Set when send() answered an error of its own; atomics, so the proxy reads them without mu_
  // (it may record from a disconnect callback while another thread writes).
  std::atomic<int> refused_status_{0};
  std::atomic<const char*> refused_code_{""};
};

}  // namespace servedeck::gateway::responses
