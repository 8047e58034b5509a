// TextModel over a Hugging Face checkpoint directory: tokenizer.json (worker/tokenizer) and the
// chat template from chat_template.jinja or tokenizer_config.json "chat_template" (a string, or a
// list of {"name","template"} where "default" is used), with bos_token/eos_token from
// tokenizer_config.json (a string, an {"content": …} object, or null).
#pragma once

#include <memory>
#include <string>

#include "worker/server/text_model.hpp"

namespace servedeck::worker {

/// Loads `dir`'s tokenizer and chat template. Throws std::runtime_error naming the file and what
/// was wrong (missing tokenizer.json, no chat template, template syntax error with line:column).
std::unique_ptr<TextModel> load_hf_text_model(const std::string& dir);

}  // namespace servedeck::worker
