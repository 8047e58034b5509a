// Chat templates: the Jinja template a checkpoint ships (tokenizer_config.json "chat_template",
// or chat_template.jinja) rendered by our Jinja-subset interpreter, exactly as transformers'
// apply_chat_template / @huggingface/jinja render it.
//
// Semantics are Python jinja2 3.1 in transformers' configuration (ImmutableSandboxedEnvironment,
// trim_blocks, lstrip_blocks, loopcontrols, its own tojson/raise_exception/strftime_now);
// docs/chat-templates.md lists what is supported and where @huggingface/jinja differs.
//
// Thread-safety: a parsed ChatTemplate is immutable; render() may run concurrently.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace servedeck::worker {

/// A parse or render error. what() names line and column in the template source and the
/// construct: "chat template 12:5: unsupported filter 'wordwrap'".
struct TemplateError : std::runtime_error {
  TemplateError(const std::string& msg, int line, int column);
  int line;
  int column;
};

/// raise_exception() called by the template: the message is the template's own (a client
/// error: the conversation breaks a rule of the template, e.g. roles not alternating).
struct TemplateRaised : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// Bounds on one render, so that no template or context can hang or exhaust memory.
struct RenderLimits {
  /// Largest string any value, and the output, may reach (bytes).
  size_t max_string_bytes = size_t{32} << 20;
  /// Statements executed plus expressions evaluated (each counts one).
  uint64_t max_steps = 20'000'000;
  /// Nesting of macro and caller() calls.
  int max_call_depth = 100;
};

class ChatTemplate {
 public:
  /// Parses `source`. Throws TemplateError for syntax the interpreter does not support.
  static ChatTemplate parse(std::string_view source);

  ChatTemplate(ChatTemplate&&) noexcept;
  ChatTemplate& operator=(ChatTemplate&&) noexcept;
  ~ChatTemplate();

  /// Renders with `context` as the global variables: typically
  ///   {"messages": [...], "tools": [...]?, "add_generation_prompt": bool,
  ///    "bos_token": "...", "eos_token": "...", ...chat_template_kwargs}
  /// Throws TemplateError (with line/column) or TemplateRaised.
  /// note: nlohmann::json stores objects sorted by key, so `tojson` of a dict from it lists
  /// keys alphabetically; pass nlohmann::ordered_json to keep the client's key order.
  std::string render(const nlohmann::json& context) const;
  /// As above with the context's key order preserved (what transformers does with dicts).
  std::string render(const nlohmann::ordered_json& context) const;
  std::string render(const nlohmann::ordered_json& context, const RenderLimits& limits) const;

 private:
  struct Impl;
  explicit ChatTemplate(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace servedeck::worker
