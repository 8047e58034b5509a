// Discovery of values the checkpoint itself declares, and path resolution for models.toml.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace servedeck::registry {

/// model_max_ctx read from `<checkpoint>/config.json`: `max_position_embeddings` at the top level,
/// else `text_config.max_position_embeddings` (multimodal configs nest the language model there).
struct MaxCtxDiscovery {
  std::optional<int64_t> max_ctx;  // tokens; nullopt when not found
  std::string source;              // "config.json max_position_embeddings" | "config.json text_config.max_position_embeddings"
  std::string error;               // set when config.json exists but cannot be read or parsed; "" otherwise
  bool config_exists = false;
};
MaxCtxDiscovery discover_model_max_ctx(const std::string& checkpoint_dir);

/// Resolves a path written in models.toml: "" stays ""; "~/x" → $HOME/x; absolute stays; relative
/// resolves against `base_dir` (the config file's directory). Lexically normalised.
std::string resolve_config_path(const std::string& p, const std::string& base_dir);

/// A program name as the launcher will find it: a path containing '/' is returned as is; a bare name
/// is searched in $PATH (first executable match). "" when not found.
std::string resolve_program(const std::string& program);

}  // namespace servedeck::registry
