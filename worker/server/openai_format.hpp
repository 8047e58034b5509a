// JSON pieces of the OpenAI / vLLM response shapes shared by the routes: ids, usage, logprobs
// (chat shape, legacy completions shape, vLLM prompt_logprobs), and a dump that never throws on
// invalid UTF-8 (token bytes can split a character: replaced by U+FFFD).
#pragma once

#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "worker/engine/engine.hpp"
#include "worker/engine/vocab.hpp"

namespace servedeck::worker {

/// JSON text; invalid UTF-8 in strings becomes U+FFFD instead of throwing.
std::string dump_json(const nlohmann::json& j);

/// `prefix` + 24 random hex digits ("chatcmpl-…", "cmpl-…").
std::string make_response_id(std::string_view prefix);

/// Seconds since the epoch (the "created" field).
long long unix_now();

/// {"prompt_tokens","completion_tokens","total_tokens","prompt_tokens_details":{"cached_tokens"},
///  "completion_tokens_details":{"reasoning_tokens"}}: cached_tokens are the prompt tokens reused
/// from the prefix cache (OpenAI's field), included in prompt_tokens.
nlohmann::json usage_json(const GenerationResult& r);

/// A token as logprobs name it: its text, or "token_id:<id>" when `as_ids` (vLLM's
/// return_tokens_as_token_ids, for clients that must tell apart tokens whose text is not valid
/// UTF-8 or repeats).
std::string token_name(int32_t id, const Vocab& vocab, bool as_ids);

/// Chat shape, one entry of logprobs.content:
/// {"token","logprob","bytes":[…],"top_logprobs":[{"token","logprob","bytes"}…]}; "bytes" are
/// always the token's own bytes.
nlohmann::json chat_logprob_entry(const TokenLogprob& lp, const Vocab& vocab, bool as_ids = false);

/// Legacy completions shape: appends to {"tokens":[],"token_logprobs":[],"top_logprobs":[],
/// "text_offset":[]} (created when null). `text_offset` is the character offset of the token.
void append_completion_logprob(nlohmann::json& logprobs, const TokenLogprob& lp, const Vocab& vocab,
                               std::size_t text_offset, bool as_ids = false);

/// vLLM's prompt_logprobs: [null, {"<id>": {"logprob","rank","decoded_token"}, …}, …] — the
/// prompt token itself plus its top alternatives at each position.
nlohmann::json prompt_logprobs_json(const GenerationResult& r, const Vocab& vocab, bool as_ids = false);

/// "stop" | "length" (for the API; cancelled/error never reach a client as a finish reason).
std::string_view api_finish_reason(FinishReason r);

}  // namespace servedeck::worker
