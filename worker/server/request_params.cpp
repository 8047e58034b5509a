#include "worker/server/request_params.hpp"

#include <cmath>
#include <limits>

namespace servedeck::worker {

std::string describe_value(const nlohmann::json& v) {
  std::string s = v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  if (s.size() > 80) s = s.substr(0, 77) + "...";
  return s;
}

namespace {

std::string expected(std::string_view field, std::string_view what, const nlohmann::json& got) {
  return "field '" + std::string(field) + "': expected " + std::string(what) + ", got " + describe_value(got);
}

const nlohmann::json* get(const nlohmann::json& body, const char* key) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return nullptr;
  return &*it;
}

std::optional<std::string> read_number(const nlohmann::json& body, const char* key, double lo, double hi,
                                       std::optional<double>& out) {
  const auto* v = get(body, key);
  if (!v) return std::nullopt;
  if (!v->is_number() || !std::isfinite(v->get<double>()) || v->get<double>() < lo || v->get<double>() > hi) {
    return expected(key, "a number in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]", *v);
  }
  out = v->get<double>();
  return std::nullopt;
}

std::optional<std::string> read_int(const nlohmann::json& body, const char* key, long long lo, long long hi,
                                    std::optional<long long>& out) {
  const auto* v = get(body, key);
  if (!v) return std::nullopt;
  // note: an unsigned value above LLONG_MAX would read as a negative long long (2^64-1 as -1).
  const bool above = v->is_number_unsigned() && v->get<unsigned long long>() > static_cast<unsigned long long>(hi);
  if (!v->is_number_integer() || above || v->get<long long>() < lo || v->get<long long>() > hi) {
    return expected(key, "an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]", *v);
  }
  out = v->get<long long>();
  return std::nullopt;
}

std::optional<std::string> read_bool(const nlohmann::json& body, const char* key, bool& out) {
  const auto* v = get(body, key);
  if (!v) return std::nullopt;
  if (!v->is_boolean()) return expected(key, "true or false", *v);
  out = v->get<bool>();
  return std::nullopt;
}

/// logit_bias: {"<token id>": bias in [-100, 100], ...}, at most k_max_logit_bias entries. The
/// ids are checked against the vocabulary later (Engine::check), which this does not know.
std::optional<std::string> read_logit_bias(const nlohmann::json& body, LogitsAdjust& out) {
  const auto* lb = get(body, "logit_bias");
  if (!lb) return std::nullopt;
  if (!lb->is_object()) return expected("logit_bias", "an object of token id → bias", *lb);
  if (lb->size() > k_max_logit_bias)
    return "field 'logit_bias': expected at most " + std::to_string(k_max_logit_bias) + " token ids, got " +
           std::to_string(lb->size());
  out.bias.reserve(lb->size());
  for (const auto& [key, value] : lb->items()) {
    // note: digits only, at most 10 of them, no leading zero, read as a number <= INT32_MAX:
    // "1e3", "-1", " 5" and "99999999999" are refused rather than read as some other token, and
    // "7" and "007" cannot both bias token 7 (their sum would leave [-100, 100]).
    const bool digits = !key.empty() && key.size() <= 10 && key.find_first_not_of("0123456789") == std::string::npos &&
                        (key.size() == 1 || key[0] != '0') && std::stoll(key) <= INT32_MAX;
    const std::string shown = describe_value(nlohmann::json(key));
    if (!digits) return "field 'logit_bias': expected keys that are token ids (decimal integers), got " + shown;
    if (!value.is_number() || !std::isfinite(value.get<double>()) || value.get<double>() < -100.0 || value.get<double>() > 100.0)
      return "field 'logit_bias[" + shown + "]': expected a number in [-100, 100], got " + describe_value(value);
    out.bias.emplace_back(static_cast<int32_t>(std::stoll(key)), static_cast<float>(value.get<double>()));
  }
  return std::nullopt;
}

}  // namespace

std::optional<std::string> parse_common_params(const nlohmann::json& body, ApiKind kind, CommonParams& out,
                                               const SamplingParams& defaults) {
  GenerationRequest& g = out.gen;
  if (auto e = read_bool(body, "stream", out.stream)) return e;
  if (const auto* so = get(body, "stream_options")) {
    if (!so->is_object()) return expected("stream_options", "an object", *so);
    if (const auto* iu = get(*so, "include_usage"); iu && !iu->is_boolean())
      return expected("stream_options.include_usage", "true or false", *iu);
    if (auto e = read_bool(*so, "include_usage", out.include_usage)) return e;
  }
  for (const char* key : {"n", "best_of"})
    if (const auto* n = get(body, key); n && (!n->is_number_integer() || n->get<long long>() != 1))
      return expected(key, "1 (this engine returns one choice)", *n);
  std::optional<long long> max_tokens;
  if (auto e = read_int(body, "max_tokens", 1, 1LL << 40, max_tokens)) return e;
  if (kind == ApiKind::chat) {
    // Both are read; max_completion_tokens (OpenAI's current name) wins, as in vLLM's
    // `max_completion_tokens or max_tokens`.
    std::optional<long long> max_completion_tokens;
    if (auto e = read_int(body, "max_completion_tokens", 1, 1LL << 40, max_completion_tokens)) return e;
    if (max_completion_tokens) max_tokens = max_completion_tokens;
  }
  if (max_tokens) {
    g.max_tokens = static_cast<std::size_t>(*max_tokens);
    out.max_tokens_given = true;
  }
  std::optional<double> temperature, top_p;
  if (auto e = read_number(body, "temperature", 0.0, 100.0, temperature)) return e;
  if (auto e = read_number(body, "top_p", 0.0, 1.0, top_p)) return e;
  if (top_p && *top_p <= 0.0) return expected("top_p", "a number in (0, 1]", body["top_p"]);
  g.sampling.temperature = temperature.value_or(defaults.temperature);
  g.sampling.top_p = top_p.value_or(defaults.top_p);
  std::optional<long long> top_k, seed, budget, prompt_logprobs;
  if (auto e = read_int(body, "top_k", -1, std::numeric_limits<int>::max(), top_k)) return e;
  g.sampling.top_k = top_k ? (*top_k > 0 ? static_cast<int>(*top_k) : 0) : defaults.top_k;
  if (const auto* s = get(body, "seed")) {
    if (!s->is_number_integer()) return expected("seed", "an integer", *s);
    g.sampling.seed = s->is_number_unsigned() ? s->get<uint64_t>() : static_cast<uint64_t>(s->get<int64_t>());
  }
  {
    std::optional<double> presence, frequency, repetition;
    if (auto e = read_number(body, "presence_penalty", -2.0, 2.0, presence)) return e;
    if (auto e = read_number(body, "frequency_penalty", -2.0, 2.0, frequency)) return e;
    // note: at least 0.01: a tiny penalty (1e-300 is 0 as a float) would divide logits into inf.
    if (auto e = read_number(body, "repetition_penalty", 0.01, 100.0, repetition)) return e;
    g.adjust.presence_penalty = static_cast<float>(presence.value_or(0.0));
    g.adjust.frequency_penalty = static_cast<float>(frequency.value_or(0.0));
    g.adjust.repetition_penalty = static_cast<float>(repetition.value_or(1.0));
  }
  if (auto e = read_logit_bias(body, g.adjust)) return e;
  if (const auto* rf = get(body, "response_format")) {
    const auto* type = rf->is_object() ? get(*rf, "type") : nullptr;
    if (!type || !type->is_string())
      return expected("response_format", "an object with a string \"type\"", *rf);
    const auto& t = type->get_ref<const std::string&>();
    // note: refused, not ignored: a client that asked for JSON would otherwise get free text
    // and fail later, far from the cause.
    if (t == "json_object" || t == "json_schema")
      return "field 'response_format': type \"" + t +
             "\" is not supported by this engine (no constrained decoding); expected \"text\" or no response_format";
    if (t != "text") return expected("response_format.type", "\"text\", \"json_object\" or \"json_schema\"", *type);
  }
  if (const auto* u = get(body, "user"); u && !u->is_string()) return expected("user", "a string", *u);
  if (const auto* s = get(body, "stop")) {
    if (s->is_string()) {
      g.stop = {s->get<std::string>()};
    } else if (s->is_array()) {
      if (s->size() > k_max_stop_strings)
        return "field 'stop': expected at most " + std::to_string(k_max_stop_strings) + " strings, got " +
               std::to_string(s->size());
      for (const auto& x : *s) {
        if (!x.is_string()) return expected("stop", "a string or an array of strings", *s);
        g.stop.push_back(x.get<std::string>());
      }
    } else {
      return expected("stop", "a string or an array of strings", *s);
    }
    for (std::size_t i = 0; i < g.stop.size(); ++i)
      if (g.stop[i].size() > k_max_stop_bytes)
        return "field 'stop': expected strings of at most " + std::to_string(k_max_stop_bytes) + " bytes, got " +
               std::to_string(g.stop[i].size()) + " bytes in stop[" + std::to_string(i) + "]";
  }
  if (const auto* s = get(body, "stop_token_ids")) {
    constexpr const char* what = "an array of token ids (integers in [0, 2147483647])";
    if (!s->is_array()) return expected("stop_token_ids", what, *s);
    if (s->size() > k_max_stop_token_ids)
      return "field 'stop_token_ids': expected at most " + std::to_string(k_max_stop_token_ids) + " ids, got " +
             std::to_string(s->size());
    for (const auto& x : *s) {
      // note: a bare cast would read 2^32 as token 0, a real token that then stops the answer.
      if (!x.is_number_integer() || (x.is_number_unsigned() && x.get<uint64_t>() > INT32_MAX) ||
          x.get<long long>() < 0 || x.get<long long>() > INT32_MAX)
        return expected("stop_token_ids", what, *s);
      g.stop_token_ids.push_back(static_cast<int32_t>(x.get<long long>()));
    }
  }
  if (auto e = read_bool(body, "ignore_eos", g.ignore_eos)) return e;
  if (auto e = read_bool(body, "skip_special_tokens", out.skip_special_tokens)) return e;
  g.skip_special = out.skip_special_tokens;
  if (auto e = read_int(body, "thinking_token_budget", 0, 1LL << 40, budget)) return e;
  if (budget) g.thinking_token_budget = static_cast<std::size_t>(*budget);
  if (auto e = read_int(body, "prompt_logprobs", 0, k_max_top_logprobs, prompt_logprobs)) return e;
  if (prompt_logprobs) g.prompt_logprobs = static_cast<int>(*prompt_logprobs);
  if (prompt_logprobs && out.stream)
    return "field 'prompt_logprobs': returned only in a non-streamed answer; expected \"stream\": false with it";
  if (auto e = read_bool(body, "return_tokens_as_token_ids", out.tokens_as_ids)) return e;

  if (kind == ApiKind::chat) {
    if (auto e = read_bool(body, "logprobs", out.want_logprobs)) return e;
    std::optional<long long> top;
    if (auto e = read_int(body, "top_logprobs", 0, k_max_top_logprobs, top)) return e;
    out.top_logprobs = static_cast<int>(top.value_or(0));
  } else {
    std::optional<long long> lp;
    if (auto e = read_int(body, "logprobs", 0, k_max_top_logprobs, lp)) return e;
    out.want_logprobs = lp.has_value();
    out.top_logprobs = static_cast<int>(lp.value_or(0));
  }
  g.logprobs = out.want_logprobs ? out.top_logprobs : -1;
  return std::nullopt;
}

}  // namespace servedeck::worker
