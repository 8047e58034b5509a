// Where a checkpoint keeps its chat template, and the special tokens its context needs.
//
// Hugging Face checkpoints ship the template either as `chat_template.jinja` (newer) or in
// `tokenizer_config.json` under "chat_template": a string, or a list of
// {"name": ..., "template": ...} (e.g. "default" and "tool_use"). transformers prefers the
// .jinja file; so do we.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace servedeck::worker {

/// The template named `name` from a parsed tokenizer_config.json. For a list, "default" is
/// also matched when `name` is empty. Throws std::runtime_error naming what was found when
/// there is no such template.
std::string chat_template_from_config(const nlohmann::json& tokenizer_config, std::string_view name = "default");

/// Reads `dir/chat_template.jinja` if it exists, else `dir/tokenizer_config.json`'s template
/// `name`. Throws std::runtime_error naming the file and what was expected.
std::string load_chat_template_source(const std::filesystem::path& dir, std::string_view name = "default");

/// A special token from tokenizer_config.json: "bos_token": "<s>" or an AddedToken object
/// {"content": "<s>", ...}; nullopt when absent or null.
std::optional<std::string> special_token(const nlohmann::json& tokenizer_config, std::string_view key);

}  // namespace servedeck::worker
