// Counting a chat request's prompt tokens with the engine's own tokenizer and chat template:
// POST /tokenize in vLLM's shape ({"model", "messages", "tools"?, "chat_template_kwargs"?,
// "add_generation_prompt": true} → {"count", ...}), which vLLM and servedeck-worker serve.
// llama-server's /tokenize takes text only (no messages), so it is not asked. Used by the
// output-budget fit (policies/fit_output_budget.hpp) and POST /v1/messages/count_tokens.
//
// Threading: the callback runs once, on `executor` (the caller's strand). Never throws.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include <boost/asio/any_io_executor.hpp>
#include <nlohmann/json.hpp>

#include "registry/model_entry.hpp"

namespace servedeck::gateway {

/// The engine's count, or why there is none.
struct TokenCount {
  std::optional<int64_t> tokens;  // prompt tokens as the engine renders and tokenizes them
  std::string why;                // when `tokens` is empty: "the engine answered HTTP 404", ...
};

/// Whether the model's engine kind serves a chat-aware /tokenize (native, vllm, and command
/// engines, which are asked and may refuse; not llama.cpp).
bool engine_tokenizes_chat(const registry::ModelEntry& model);

/// The /tokenize body for a chat completion body: its messages, tools and chat_template_kwargs,
/// `model` = the served name, add_generation_prompt true.
nlohmann::json tokenize_request(const nlohmann::json& chat_body, const std::string& served_name);

/// POSTs tokenize_request(chat_body) to the engine at host:port with the model's connect
/// deadline and `timeout_ms` for the answer; `done` gets the count or the reason.
void count_chat_tokens(boost::asio::any_io_executor executor, const std::string& host, int port,
                       const registry::ModelEntry& model, const nlohmann::json& chat_body, int timeout_ms,
                       std::function<void(TokenCount)> done);

}  // namespace servedeck::gateway
