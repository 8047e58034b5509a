// Reading the generation fields shared by /v1/chat/completions and /v1/completions (OpenAI
// names plus vLLM's extras) into an engine GenerationRequest. Every error names the field, what
// was read and what was expected: "field 'temperature': expected a number >= 0, got \"hot\"".
// Never throws.
#pragma once

#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "worker/engine/engine.hpp"

namespace servedeck::worker {

enum class ApiKind { chat, completions };

struct CommonParams {
  GenerationRequest gen;                  // prompt not set; max_tokens set when given
  bool max_tokens_given = false;
  bool stream = false;
  bool include_usage = false;             // stream_options.include_usage
  bool want_logprobs = false;             // chat: logprobs true; completions: logprobs is a number
  int top_logprobs = 0;
  bool skip_special_tokens = true;
  bool tokens_as_ids = false;             // vLLM's return_tokens_as_token_ids: logprobs name tokens "token_id:<id>"
};

/// Maximum accepted top_logprobs / logprobs / prompt_logprobs (OpenAI allows 20).
inline constexpr int k_max_top_logprobs = 20;

/// Most stop strings, and bytes in one, a request may give (OpenAI allows 4 strings). Each
/// generated token is matched against every stop string, so these bound that work per token.
inline constexpr std::size_t k_max_stop_strings = 64;
inline constexpr std::size_t k_max_stop_bytes = 4096;
/// Most stop_token_ids a request may give (each generated token is looked up among them).
inline constexpr std::size_t k_max_stop_token_ids = 1024;

/// Most logit_bias entries a request may give (each is applied to every sampled row).
inline constexpr std::size_t k_max_logit_bias = 4096;

/// Reads `body` (an object) into `out`; temperature/top_p/top_k the body omits come from
/// `defaults`. Returns an error message for the client, or nullopt.
std::optional<std::string> parse_common_params(const nlohmann::json& body, ApiKind kind, CommonParams& out,
                                               const SamplingParams& defaults = {});

/// "got <json>" text for messages: the value as JSON, shortened to 80 characters.
std::string describe_value(const nlohmann::json& v);

}  // namespace servedeck::worker
