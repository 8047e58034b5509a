// The OpenAI error envelope, used for every client-facing error of the gateway and the worker:
//   {"error": {"message": "...", "type": "...", "code": "...", "param": null, "source": "servedeck"}}
// `source` says who produced the error: "servedeck" (the gateway itself) or "engine" (the engine
// process behind a slot, passed through or wrapped). Shape from the OpenAI API reference,
// "Error codes"; `source` is our addition and clients ignore unknown keys.
#pragma once

#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace servedeck {

enum class ErrorSource { servedeck, engine };

std::string_view to_string(ErrorSource s);

/// Builds the envelope. `type` follows OpenAI's vocabulary: "invalid_request_error",
/// "authentication_error", "not_found_error", "server_error", "timeout_error", "overloaded_error".
/// `code` is a short machine-readable reason (e.g. "model_not_running", "upstream_closed").
/// `param`: the request field at fault ("" → null).
nlohmann::json make_error(std::string_view message, std::string_view type, std::string_view code,
                          ErrorSource source = ErrorSource::servedeck, std::string_view param = {});

}  // namespace servedeck
