// Anthropic Messages API → chat completions: the request side of the /v1/messages bridge.
//
// servedeck serves POST /v1/messages (Claude Code, the Anthropic SDKs) itself by translating the
// request onto /v1/chat/completions, so every per-model policy, honest ending and deadline of the
// chat path applies; gateway/anthropic/messages_responder.hpp translates the answer back. Shapes
// follow Anthropic's Messages API reference ("Create a Message": request fields, content blocks,
// tools, tool_choice, extended thinking). docs/anthropic.md has the field mapping.
//
// Thread-safety: pure functions.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace servedeck::gateway::anthropic {

/// Per-model choices the translation needs (from the registry entry the `model` resolves to).
struct TranslateOptions {
  /// Remove Claude Code's per-request `x-anthropic-billing-header: …` system text block before
  /// rendering (its `cch=` value changes every request and defeats the engine's prefix cache).
  /// Registry: policies.strip_billing_header (default true).
  bool strip_billing_header = true;
  /// The model accepts images (registry `vision`, default false). Without it an `image` block is
  /// refused with a 400 naming the model, never silently dropped.
  bool vision = false;
  std::string model_name;  // the registry table key, for messages
};

struct TranslatedRequest {
  nlohmann::json chat = nlohmann::json::object();  // the /v1/chat/completions body
  bool stream = false;
  /// `stop_sequences` as sent: a finish "stop" whose matched stop string is one of them becomes
  /// stop_reason "stop_sequence".
  std::vector<std::string> stop_sequences;
  /// What was dropped or ignored, one line each (logged by the gateway, never a 400):
  /// "dropped server tool 'web_search' of type 'web_search_20250305' (the engine cannot run it)".
  std::vector<std::string> warnings;
  int billing_blocks_removed = 0;  // x-anthropic-billing-header blocks removed from `system`
};

/// A refusal of the whole request (HTTP 400 invalid_request_error), naming the field.
struct TranslateError {
  std::string message;  // "messages.2.content.0: image blocks need a model with vision; …"
};

/// Translates a Messages request body (already parsed, any JSON value). Fills `out`, or returns
/// why the body is not a Messages request the bridge can serve: not an object, no string
/// `model`, `messages` not a non-empty array, a message or block of the wrong shape, an image
/// for a model without vision, `max_tokens` not a positive integer. Unknown or unsupported
/// optional fields are ignored with a warning. Never throws.
std::optional<TranslateError> translate_request(const nlohmann::json& body, const TranslateOptions& options,
                                                TranslatedRequest& out);

/// True when `text` is Claude Code's billing header block ("x-anthropic-billing-header: …",
/// leading whitespace allowed; the header name case-insensitive).
bool is_billing_header(const std::string& text);

}  // namespace servedeck::gateway::anthropic
