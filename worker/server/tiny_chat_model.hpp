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

/// Writes the chat tiny model to `out_dir` (as write_tiny_model; the reply and its start tokens
/// are tokenized with `tokenizer_dir`/tokenizer.json). Residual writes are scaled by 0.05
/// (PlantedReply explains why). Throws std::runtime_error naming the file or token that failed.
void write_tiny_chat_model(const std::string& out_dir, const std::string& tokenizer_dir, std::uint64_t seed = 0);

}  // namespace servedeck::worker
