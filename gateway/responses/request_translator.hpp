// Responses API → chat completions: the request side of the /v1/responses bridge.
//
// servedeck serves POST /v1/responses itself by translating onto /v1/chat/completions, so every
// per-model policy (which works on chat completions) applies and every stream ends properly.
// Shapes follow the OpenAI Responses API reference ("Create a model response", input items,
// tools); namespace tool groups are the shape Codex sends for MCP servers (field case G33).
//
// Thread-safety: pure functions.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace servedeck::gateway::responses {

/// Where a flattened function name came from: `{"namespace": "mcp_fs", "name": "read"}` is sent
/// to the engine as `mcp_fs__read` and mapped back on output.
struct ToolOrigin {
  std::string ns;    // "" for a top-level function tool
  std::string name;  // the name the client declared
};

struct TranslatedRequest {
  nlohmann::json chat = nlohmann::json::object();  // the /v1/chat/completions body
  /// Engine-side (flattened) function name → what the client declared.
  std::map<std::string, ToolOrigin> tool_names;
  /// What was dropped or repaired, one line each (logged by the gateway, never a 400):
  /// "dropped tool of type 'web_search' (the engine cannot run it)".
  std::vector<std::string> warnings;
  bool stream = false;
  bool store = true;                                // Responses default: store = true
  std::string previous_response_id;
  /// Request fields echoed in the response object (instructions, tools, temperature, ...).
  nlohmann::json echo = nlohmann::json::object();
};

/// Translates a Responses request body. `previous_messages` are the chat messages stored for
/// `previous_response_id` (the earlier turn's input and output), or null when none.
/// Returns an error message (the client's fault, HTTP 400) when the body is not a Responses
/// request at all (not an object, `input` of a wrong type, `model` missing, a field of the
/// wrong type — inside an item too, named by its path: "field 'input.3.name' has the wrong
/// type: expected a string, got number"); otherwise fills `out`. Items that cannot be
/// translated are dropped with a warning, never a 400.
std::optional<std::string> translate_request(const nlohmann::json& body,
                                             const nlohmann::json* previous_messages,
                                             TranslatedRequest& out);

/// The engine-side name for a function `name` in namespace `ns`: `<ns>__<name>`, characters
/// outside [A-Za-z0-9_-] replaced by '_', at most 64 characters (longer names keep a prefix
/// and a stable 8-hex-digit hash suffix). Stable: the same input always gives the same name.
std::string flatten_tool_name(const std::string& ns, const std::string& name);

}  // namespace servedeck::gateway::responses
