// Reasoning field dialects and mirror_content (issue 7 §5; field case G20).
//
// Engines and clients name an assistant turn's reasoning either `reasoning_content` (vLLM,
// DeepSeek) or `reasoning` (OpenRouter-style clients, newer vLLM). Incoming history is
// normalised to `reasoning_content`, which the chat templates read (a message carrying both keeps
// reasoning_content). Counted as "reasoning_dialects". On by default; PolicyConfig::extra
// ["reasoning_dialects"] = false turns it off.
//
// Responses accept either name in messages and deltas; with mirror_content the reasoning is
// emitted under both names (clients differ in which one they show). A chunk that carries only
// reasoning is never dropped.
#pragma once

#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "policies/pipeline.hpp"

namespace servedeck::policies {

/// The reasoning text of a message or delta: `reasoning_content` when it is a string, else
/// `reasoning`; nullopt when neither.
std::optional<std::string> reasoning_of(const nlohmann::json& message_or_delta);

/// Removes both reasoning fields.
void erase_reasoning(nlohmann::json& message_or_delta);

/// Writes `text` as reasoning: `reasoning_content`, plus `reasoning` when `mirror`. Without
/// `mirror`, an object that already used `reasoning` (and not reasoning_content) keeps that name.
void set_reasoning(nlohmann::json& message_or_delta, const std::string& text, bool mirror);

/// Request side: history normalisation. Never fails.
void apply_reasoning_dialects(nlohmann::json& body, RequestContext& ctx);

}  // namespace servedeck::policies
