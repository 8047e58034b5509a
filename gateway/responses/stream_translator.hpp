// Chat completions → Responses API: the response side of the /v1/responses bridge.
//
// One translator per response. Streamed chat.completion.chunk objects go in; Responses stream
// events come out in the documented order:
//   response.created, response.in_progress,
//   per output item: response.output_item.added,
//     reasoning: response.reasoning_text.delta… / .done
//     message:   response.content_part.added, response.output_text.delta… / .done,
//                response.content_part.done
//     function:  response.function_call_arguments.delta… / .done
//   response.output_item.done,
//   and last exactly one of response.completed, response.incomplete (finish "length" or
//   "content_filter"), or
//   response.failed (any upstream failure, at any point: field case G32; and an answer whose
//   text passes k_max_stream_text_bytes, common/stream_limits.hpp: code stream_too_large).
// A non-streaming chat.completion is translated through the same state machine
// (translate_completion), so both paths produce the same output items.
//
// Thread-safety: one translator per response, used from one thread at a time.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "gateway/responses/request_translator.hpp"

namespace servedeck::gateway::responses {

/// One Responses stream event: `type` is also the SSE `event:` name; `data` includes
/// "type" and "sequence_number".
struct StreamEvent {
  std::string type;
  nlohmann::json data;
  /// `event: <type>\ndata: <json>\n\n`
  std::string to_sse() const;
};

class StreamTranslator {
 public:
  /// `response_id` like "resp_<hex>"; `model` is what the client asked for (echoed);
  /// `created_at` in Unix seconds; `request` is the translated request (echo fields, tool map).
  StreamTranslator(std::string response_id, std::string model, int64_t created_at,
                   const TranslatedRequest& request);

  /// response.created and response.in_progress.
  std::vector<StreamEvent> start();
  /// One upstream chat.completion.chunk (already normalised by the gateway).
  std::vector<StreamEvent> on_chunk(const nlohmann::json& chunk);
  /// Upstream ended properly: closes open items, then response.completed (or .incomplete when
  /// the finish reason was "length" or "content_filter", with incomplete_details.reason
  /// "max_output_tokens" or "content_filter"; then the last output item, the one the limit or
  /// the filter cut, is closed with status "incomplete" and earlier items with "completed", as
  /// OpenAI does).
  std::vector<StreamEvent> finish();
  /// Upstream failed: closes nothing further, emits response.failed with `code` and `message`.
  std::vector<StreamEvent> fail(const std::string& code, const std::string& message);

  /// The response object as it stands (status in_progress until finish()/fail()).
  nlohmann::json response() const;
  /// True once finish() or fail() ran.
  bool ended() const { return ended_; }
  /// "in_progress" until finish() or fail(); then "completed", "incomplete" or "failed".
  const std::string& status() const { return status_; }
  /// The chat messages this response added (assistant turn), for previous_response_id storage.
  nlohmann::json assistant_messages() const;

 private:
  enum class ItemKind { reasoning, message, function_call };
  struct OpenItem {
    ItemKind kind;
    int output_index;
    std::string id;
    std::string text;        // reasoning or message text, or function arguments
    std::string call_id;     // function_call
    std::string name;        // function_call: the client's name
    std::string ns;          // function_call: the client's namespace, "" when none
    std::string engine_name; // function_call: name the engine used (for history)
    bool truncated = false;  // the item the token limit cut (finish "length"): status "incomplete" once done
  };

  StreamEvent make(const std::string& type, nlohmann::json data);
  void close_current(std::vector<StreamEvent>& out);
  void open_item(ItemKind kind, std::vector<StreamEvent>& out);
  nlohmann::json item_json(const OpenItem& item, bool done) const;
  nlohmann::json usage_json() const;

  std::string response_id_;
  std::string model_;
  int64_t created_at_;
  const TranslatedRequest* request_;
  int64_t sequence_ = 0;
  int item_counter_ = 0;
  std::vector<OpenItem> items_;       // every item, in output order
  int current_ = -1;                  // index into items_ of the open reasoning/message item
  std::map<int64_t, int> tool_index_; // chat tool_calls index → items_ index
  std::string finish_reason_;
  nlohmann::json usage_;              // upstream usage (chat shape), null when none
  std::size_t text_bytes_ = 0;        // text kept in items_, bytes (≤ k_max_stream_text_bytes)
  std::string status_ = "in_progress";
  nlohmann::json error_;              // set by fail()
  bool ended_ = false;
};

/// Translates a whole chat.completion into a Responses response object.
nlohmann::json translate_completion(const nlohmann::json& completion, const std::string& response_id,
                                    const std::string& model, int64_t created_at,
                                    const TranslatedRequest& request);

}  // namespace servedeck::gateway::responses
