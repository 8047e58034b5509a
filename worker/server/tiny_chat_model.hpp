// The "chat" tiny model: the tiny qwen3_moe checkpoint (TinyModelOptions defaults) with a planted
// reply, so that after the Qwen3 chat template's generation prompt ("<|im_start|>assistant\n",
// or "...</think>\n\n" with thinking off) greedy decoding says k_tiny_chat_reply and ends the turn
// with <|im_end|>. Agent clients (Codex) need a model that ends its turns; the random tiny model
// never samples an end token and stops only at max_tokens.
#pragma once

#include <cstdint>
#include <string>

namespace servedeck::worker {

/// The planted reply (9 Qwen3 tokens, all distinct).
inline constexpr const char* k_tiny_chat_reply = "Hello from servedeck's tiny model.";

/// The tool call the "tool" tiny model makes after a prompt (Hermes markup, as Qwen3's template
/// asks; spaced so that its 17 tokens are all distinct): Claude Code's Bash tool creating
/// ran.txt in the working directory.
inline constexpr const char* k_tiny_tool_call =
    "<tool_call>{\"name\":\"Bash\",\"arguments\":{\"command\": \"touch ran.txt\"}}</tool_call>";

/// Writes the "tool" tiny model to `out_dir`: the chat tiny model whose first turn is
/// k_tiny_tool_call (then <|im_end|>), and whose turn after a tool result (a <tool_response> in
/// the context; PlantedSwitch) is k_tiny_chat_reply. Throws std::runtime_error as
/// write_tiny_chat_model.
void write_tiny_tool_model(const std::string& out_dir, const std::string& tokenizer_dir, std::uint64_t seed = 0);

/// The tool call the "tool" tiny GLM model makes after a prompt: GLM markup (as GLM-4.7's
/// template writes it, without newlines, so that its 11 tokens are all distinct) for the same
/// Bash call as k_tiny_tool_call.
inline constexpr const char* k_tiny_glm_tool_call =
    "<tool_call>Bash<arg_key>command</arg_key><arg_value>touch ran.txt</arg_value></tool_call>";

/// Writes the tiny glm4_moe checkpoint (tiny_glm_options(), GLM-4.5's chat template, the GLM
/// fixture tokenizer derived from Qwen3's in `tokenizer_dir`: glm_fixture_tokenizer.hpp).
/// `variant`: "random" (the numerics reference), "chat" (after GLM's generation prompt, which
/// ends in <|assistant|>, or in </think> with enable_thinking false, it says k_tiny_chat_reply
/// and ends the turn with <|user|>), "tool" (it says k_tiny_glm_tool_call and ends with
/// <|observation|>, GLM's end of a tool-calling turn; every turn, no switch after a result).
/// Throws std::runtime_error naming the file, token or variant that failed.
void write_tiny_glm_model(const std::string& out_dir, const std::string& tokenizer_dir, const std::string& variant,
                          std::uint64_t seed = 0);

/// Writes the chat tiny model to `out_dir` (as write_tiny_model; the reply and its start tokens
/// are tokenized with `tokenizer_dir`/tokenizer.json). Residual writes are scaled by 0.05
/// (PlantedReply explains why). Throws std::runtime_error naming the file or token that failed.
void write_tiny_chat_model(const std::string& out_dir, const std::string& tokenizer_dir, std::uint64_t seed = 0);

}  // namespace servedeck::worker
