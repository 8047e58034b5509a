// Turning an OpenAI chat request's messages (+ tools, chat_template_kwargs) into prompt token
// ids through the model's chat template, as vLLM does: string or array-of-text content (parts
// joined), assistant tool_call arguments given as JSON strings parsed into objects (templates
// such as GLM's iterate them), add_generation_prompt default true, kwargs as template globals.
// Used by /v1/chat/completions and /tokenize. Never throws.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "worker/server/text_model.hpp"
#include "worker/server/tool_choice.hpp"

namespace servedeck::worker {

struct ChatPrompt {
  std::string text;               // the rendered template
  std::vector<int32_t> tokens;
  nlohmann::json tools;           // the request's tools (null when absent)
  bool tools_enabled = false;     // tools given and tool_choice != "none"
  ToolChoice tool_choice;         // the request's tool_choice, checked against tools (tool_choice.hpp)
};

/// Why build_chat_prompt failed, as the route answers it (OpenAI error envelope fields).
struct ChatPromptError {
  int status = 400;         // 400 malformed request / refused conversation, 500 template failure
  std::string message;      // names what was read and what was expected
  std::string code;         // "invalid_messages", "invalid_tool_choice" (tool_choice.hpp), "template_failed"
  std::string param;        // the request field at fault ("tool_choice"), or "" (→ null)
};

/// Reads body["messages"], ["tools"], ["tool_choice"], ["chat_template_kwargs"],
/// ["add_generation_prompt"] and renders. Returns the error on failure: 400 "invalid_messages"
/// for a malformed request or a conversation the template refuses, 400 with param "tool_choice"
/// and code "invalid_tool_choice" for a tool_choice parse_tool_choice refuses, 500
/// "template_failed" for a template failure. The forced tool-call prefix is not added here (the
/// chat route adds it; /tokenize shows the template's prompt).
std::optional<ChatPromptError> build_chat_prompt(const nlohmann::json& body, const TextModel& text, ChatPrompt& out);

}  // namespace servedeck::worker
