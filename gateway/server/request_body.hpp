// Request bodies on the gateway's request path: JSON parsing that reports the byte offset of a
// syntax error without throwing, and the engine-neutral clean-up of a chat request (G12).
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace servedeck::gateway {

struct JsonParseError {
  std::size_t byte = 0;      // 0-based offset of the byte where parsing failed
  std::string message;       // "malformed JSON at byte 17: syntax error ... ; last read: '}'"
};

/// Parses `text` as one JSON document. Never throws: returns the document, or fills `error`
/// (with the byte offset) and returns a discarded value.
nlohmann::json parse_json(std::string_view text, JsonParseError& error);

/// Engine-neutral clean-up of a /v1/chat/completions request (G12), in place:
///   - messages: optional fields that are null or empty (`refusal`, `audio`, `function_call`,
///     `tool_calls`, `name`) dropped;
///   - tools: each `{"type":"function","function":{name, description?, parameters, strict?}}`
///     keeps only those keys (vendor keys dropped), gets `type: "function"` and an empty object
///     schema `{"type":"object","properties":{}}` when it declares no parameters.
/// Returns the number of repairs made.
int clean_chat_request(nlohmann::json& body);

}  // namespace servedeck::gateway
