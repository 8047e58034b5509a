// Reads one streamed chat completion from an OpenAI-compatible endpoint and judges whether it
// ended properly. Shared by `servedeck soak` and the end-to-end tests.
//
// A stream is "complete" only when it carried content, reasoning or a tool call, sent a finish
// reason, then `data: [DONE]`, and no error event: an HTTP 200 with an empty or cut stream is
// a failure (the operating notes' retired proxy scored 26 dead-engine turns as "60 ok").
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "common/http/client.hpp"

namespace servedeck::tools {

struct StreamedTurn {
  int status = 0;                 // HTTP status
  bool complete = false;          // see the header comment
  std::string failure;            // why not complete ("" when complete)
  std::string content;
  std::string reasoning;
  nlohmann::json tool_calls = nlohmann::json::array();  // assembled [{id, type, function:{name, arguments}}]
  std::string finish_reason;
  nlohmann::json usage;           // null unless the stream carried usage
  double ttft_ms = 0;             // request sent → first content/reasoning/tool delta
  double total_ms = 0;
  int64_t delta_events = 0;       // events carrying content, reasoning or tool-call text
  /// Completion tokens (usage when present, else delta_events) per second after the first token.
  double decode_tok_s() const;
};

/// POSTs `body` (stream forced on) to `path` and reads the stream. `timeout_ms` bounds the gap
/// between reads. Never throws: connection failures are reported in `failure`.
StreamedTurn read_chat_stream(const std::string& host, int port, const std::string& path,
                              nlohmann::json body, int timeout_ms, const std::string& api_key = "");

}  // namespace servedeck::tools
