// The text side of a loaded model as the server sees it: tokenizer and chat template behind one
// interface, so the routes run the same over the real Tokenizer + ChatTemplate
// (hf_text_model.hpp) and over a small fake in tests.
//
// Thread-safety: all methods const and safe to call concurrently.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "worker/engine/vocab.hpp"

namespace servedeck::worker {

/// The chat template refused the conversation (raise_exception) or could not render it (the
/// template loaded, so this request's messages, tools or chat_template_kwargs broke it): a client
/// error (HTTP 400) whose message says why.
struct ChatRenderError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class TextModel : public Vocab {
 public:
  /// Token ids of `text`; special-token strings written in it map to their ids.
  virtual std::vector<int32_t> encode(std::string_view text) const = 0;
  /// Text of `ids`. Returns nullopt when an id is out of range (`error` says which).
  virtual std::optional<std::string> decode(std::span<const int32_t> ids, bool skip_special,
                                            std::string& error) const = 0;
  /// Id of an exact token string (e.g. "<think>"), nullopt when absent.
  virtual std::optional<int32_t> token_id(std::string_view token) const = 0;
  virtual std::size_t vocab_size() const = 0;
  /// Renders the chat template with `context` ({"messages", "tools"?, "add_generation_prompt",
  /// ...chat_template_kwargs}); bos_token/eos_token are added by the implementation when the
  /// context lacks them. Throws ChatRenderError.
  virtual std::string render_chat(const nlohmann::json& context) const = 0;
};

}  // namespace servedeck::worker
