// Chat completions → Anthropic Messages: the response side of the /v1/messages bridge.
//
// One translator per response. Normalised chat.completion.chunk objects go in; Messages stream
// events come out in the documented order:
//   message_start                                  (once, first)
//   per content block, at indices 0, 1, 2, …:
//     content_block_start {type: thinking | text | tool_use}
//     content_block_delta … (thinking_delta | text_delta | input_json_delta; a thinking block
//                            ends with one signature_delta)
//     content_block_stop
//   message_delta {stop_reason, stop_sequence, usage}
//   message_stop                                   (last, only after a proper end)
// with `ping` events (queue and prefill heartbeats) anywhere after message_start, and on any
// upstream failure an `error` event instead of message_delta/message_stop (never a clean
// message_stop over a dead engine). The block type is tracked per index: a delta is only ever
// sent into an open block of its own type — text arriving while a tool_use block is open closes
// it and opens a new text block ("Content block is not a text block" in clients otherwise).
// Whitespace-only text while a tool_use block is open is held instead (engines send the newline
// between tool-call markup as content, even between two argument fragments of one call): it
// prefixes the next text that is more than whitespace, and is dropped when the block closes
// otherwise (a whitespace-only text block is what Anthropic's API refuses when the client sends
// the turn back: "text content blocks must contain non-whitespace text"). Arguments for a call
// whose block was already closed end the stream with an error event: never dropped. A tool_use
// block whose arguments are no JSON object (tool_input_error) ends the stream with an error
// event instead of its content_block_stop: clients parse the arguments into `input`, and
// neither `{}` nor a parse failure on their side is the call the engine made. The text kept for
// message() is bounded by k_max_stream_text_bytes (common/stream_limits.hpp): past it, an error
// event.
// A non-streaming chat.completion runs through the same state machine (translate_completion).
//
// Thread-safety: one translator per response, used from one thread at a time.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "gateway/anthropic/request_translator.hpp"

namespace servedeck::gateway::anthropic {

/// One Messages stream event; `type` is also the SSE `event:` name and `data["type"]`.
struct StreamEvent {
  std::string type;
  nlohmann::json data;
  /// `event: <type>\ndata: <json>\n\n`
  std::string to_sse() const;
};

/// The `signature` servedeck gives a thinking block: "servedeck-v1." followed by the 16 hex
/// digits of the FNV-1a 64-bit hash of the thinking text. Stable (the same text always gets the
/// same value) and opaque to clients, which send it back unchanged; it is not a MAC and proves
/// nothing — the bridge accepts any signature on later turns (request_translator.hpp).
std::string thinking_signature(const std::string& thinking);

/// Anthropic's error `type` for an HTTP status: 400 invalid_request_error, 401
/// authentication_error, 403 permission_error, 404 not_found_error, 413 request_too_large, 429
/// rate_limit_error, 503 and 529 overloaded_error, other 4xx invalid_request_error, other 5xx
/// api_error (Anthropic's "Errors" reference).
std::string error_type_for_status(int status);

/// `{"type":"error","error":{"type","message"}}`.
nlohmann::json error_body(const std::string& type, const std::string& message);

class StreamTranslator {
 public:
  /// `message_id` like "msg_<hex>"; `model` is what the client asked for (echoed).
  StreamTranslator(std::string message_id, std::string model, const TranslatedRequest& request);

  /// message_start (once; later calls return nothing).
  std::vector<StreamEvent> start();
  /// A ping (nothing before start() or after the end).
  std::vector<StreamEvent> ping();
  /// One chat.completion.chunk (normalised by the gateway).
  std::vector<StreamEvent> on_chunk(const nlohmann::json& chunk);
  /// Upstream ended properly: closes the open block, then message_delta and message_stop.
  std::vector<StreamEvent> finish();
  /// Upstream failed: one `error` event with `type` (error_type_for_status) and `message`.
  std::vector<StreamEvent> fail(const std::string& type, const std::string& message);

  bool ended() const { return ended_; }
  bool failed() const { return failed_; }
  /// The whole message object as it stands (for non-streaming answers, after finish()).
  nlohmann::json message() const;

 private:
  enum class Kind { thinking, text, tool_use };
  struct Block {
    Kind kind;
    std::string text;  // thinking text, text, or the tool call's argument JSON
    std::string id;    // tool_use
    std::string name;  // tool_use
  };

  StreamEvent make(const std::string& type, nlohmann::json data) const;
  void open(Block block, std::vector<StreamEvent>& out);
  void close_open(std::vector<StreamEvent>& out);
  void append(Kind kind, const std::string& text, std::vector<StreamEvent>& out);
  /// Counts `bytes` more kept text; past k_max_stream_text_bytes fails the stream (into `out`).
  bool within_bound(std::size_t bytes, std::vector<StreamEvent>& out);
  nlohmann::json block_json(const Block& b) const;
  nlohmann::json usage_json() const;
  std::string stop_reason() const;

  std::string id_;
  std::string model_;
  const TranslatedRequest* request_;
  std::vector<Block> blocks_;
  int open_ = -1;                   // index of the open block, -1 when none
  std::map<int64_t, int> tool_blocks_;  // chat tool_calls index → block index
  std::string finish_reason_;
  std::string stop_string_;         // the engine's matched stop string (choice.stop_reason)
  std::string held_blank_;          // whitespace-only text that came while a tool_use block was open
  std::size_t text_bytes_ = 0;      // text kept in blocks_ and held_blank_, bytes (≤ k_max_stream_text_bytes)
  nlohmann::json usage_;            // upstream usage (chat shape), null when none
  bool started_ = false;
  bool ended_ = false;
  bool failed_ = false;
};

/// Why a tool call's accumulated `arguments` cannot be a tool_use `input` (they are neither
/// empty nor a JSON object: malformed, nested deeper than k_max_json_depth, or another JSON
/// type), naming the call and quoting the first 200 bytes; nullopt when they can.
std::optional<std::string> tool_input_error(const std::string& name, const std::string& id, const std::string& arguments);

/// Translates a whole chat.completion into a Messages message object. Returns null, with the
/// reason in `*error` (when given), when the completion cannot be one: a tool call whose
/// arguments are no JSON object (tool_input_error) — the gateway answers 502.
nlohmann::json translate_completion(const nlohmann::json& completion, const std::string& message_id,
                                    const std::string& model, const TranslatedRequest& request,
                                    std::string* error = nullptr);

}  // namespace servedeck::gateway::anthropic
