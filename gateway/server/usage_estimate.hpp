// Usage numbers for when the engine reports none (field case G12's last clause): estimates of
// prompt and completion tokens from the bytes the gateway sees, and the usage object that carries
// them, flagged so that no reader takes it for the engine's. Used by the stream normaliser
// (gateway/server/stream_normalizer.hpp) and the proxy. docs/gateway.md, "Usage the engine did
// not report", has the sources and the measured error of the prompt estimate.
//
// Pure: no I/O. Never throws on any input.
#pragma once

#include <cstdint>
#include <string_view>

#include <nlohmann/json.hpp>

namespace servedeck::gateway {

/// Estimated tokens of UTF-8 text: ceil(bytes / 4). note: the 4 bytes per token is the usual
/// figure for English prose and code with 150k-vocabulary BPE tokenizers (Qwen3, GLM, DeepSeek:
/// 3.5-4.5); CJK text runs nearer 1.5 bytes per token, so this undercounts it. An estimate, never
/// reported without the `servedeck_estimated` flag.
int64_t estimate_text_tokens(std::string_view text);

/// Estimated prompt tokens of a request body, for a synthesised usage (G12): chat — every
/// message's text (string content, `text` parts, reasoning, tool-call names and arguments,
/// `name`, `tool_call_id`) through estimate_text_tokens(), plus the chat template's own tokens as
/// Qwen3's template spends them (5 per message, 3 for the assistant header, 12 per tool call, 3
/// per tool result, 100 around the tool schemas) and the serialised `tools` (the template renders
/// schemas as JSON); completions — `prompt` as a string or strings (bytes), or token ids (counted
/// exactly). note: not the engine's count: other templates spend other overheads, the tokenizer's
/// merges are not reproduced, images count 0. Measured against Qwen3's template and tokenizer on
/// the G12 fixture request: 276 estimated vs 270 (with tools), 91 vs 88 (without).
/// Returns ≥ 0; never throws.
int64_t estimate_request_tokens(const nlohmann::json& body);

/// Estimated completion tokens of a non-streamed chat.completion / text_completion body: UTF-8
/// bytes of every choice's `text`, or its message's content, reasoning, tool-call names and
/// arguments, through estimate_text_tokens()'s ratio. Returns ≥ 0; never throws.
int64_t estimate_answer_tokens(const nlohmann::json& body);

/// The usage object synthesised when the engine reported none (G12), OpenAI shape plus two
/// servedeck keys (clients ignore unknown keys):
///   {"prompt_tokens", "completion_tokens", "total_tokens",
///    "servedeck_estimated": bool,          // true when either count is an estimate
///    "servedeck_usage_source": {"prompt_tokens": S, "completion_tokens": S}}
/// Sources, most exact first:
///   - "engine_timings": llama-server's `timings` (`predicted_n` generated tokens; `prompt_n` +
///     `cache_n` prompt tokens — `prompt_n` alone counts only the tokens evaluated this request,
///     not the cached prefix, so it is used only together with `cache_n`);
///   - prompt: "request_estimate" (`prompt_tokens_estimate`, estimate_request_tokens());
///     "unknown" when that is < 0 (reported as 0, still flagged);
///   - completion: `completion_source` with `completion_estimate` (the caller's method:
///     "output_chunks" for streams — engines of this kind send about one token per content
///     chunk — or "output_bytes_estimate" for a non-streamed answer).
/// `timings` may be null or any JSON; non-integer or negative fields are ignored.
nlohmann::json synthesize_usage(const nlohmann::json& timings, int64_t prompt_tokens_estimate,
                                int64_t completion_estimate, std::string_view completion_source);

}  // namespace servedeck::gateway
