#include "worker/server/openai_format.hpp"

#include <chrono>
#include <cmath>
#include <random>

namespace servedeck::worker {

std::string dump_json(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string make_response_id(std::string_view prefix) {
  thread_local std::mt19937_64 rng(std::random_device{}());
  static constexpr char hex[] = "0123456789abcdef";
  std::string id(prefix);
  for (int i = 0; i < 24; ++i) id += hex[rng() & 15];
  return id;
}

long long unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

nlohmann::json usage_json(const GenerationResult& r) {
  return {{"prompt_tokens", r.prompt_tokens},
          {"completion_tokens", r.completion_tokens},
          {"total_tokens", r.prompt_tokens + r.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", r.cached_tokens}}},
          {"completion_tokens_details", {{"reasoning_tokens", r.reasoning_tokens}}}};
}

namespace {
nlohmann::json bytes_of(const std::string& s) {
  nlohmann::json b = nlohmann::json::array();
  for (unsigned char c : s) b.push_back(static_cast<int>(c));
  return b;
}
double finite(float x) { return std::isfinite(x) ? static_cast<double>(x) : -9999.0; }
}  // namespace

std::string token_name(int32_t id, const Vocab& vocab, bool as_ids) {
  return as_ids ? "token_id:" + std::to_string(id) : vocab.token_bytes(id);
}

nlohmann::json chat_logprob_entry(const TokenLogprob& lp, const Vocab& vocab, bool as_ids) {
  nlohmann::json top = nlohmann::json::array();
  for (const auto& [id, l] : lp.top)
    top.push_back({{"token", token_name(id, vocab, as_ids)}, {"logprob", finite(l)}, {"bytes", bytes_of(vocab.token_bytes(id))}});
  return {{"token", token_name(lp.id, vocab, as_ids)}, {"logprob", finite(lp.logprob)},
          {"bytes", bytes_of(vocab.token_bytes(lp.id))}, {"top_logprobs", top}};
}

void append_completion_logprob(nlohmann::json& logprobs, const TokenLogprob& lp, const Vocab& vocab,
                               std::size_t text_offset, bool as_ids) {
  if (!logprobs.is_object()) {
    logprobs = {{"tokens", nlohmann::json::array()},
                {"token_logprobs", nlohmann::json::array()},
                {"top_logprobs", nlohmann::json::array()},
                {"text_offset", nlohmann::json::array()}};
  }
  logprobs["tokens"].push_back(token_name(lp.id, vocab, as_ids));
  logprobs["token_logprobs"].push_back(finite(lp.logprob));
  nlohmann::json top = nlohmann::json::object();
  for (const auto& [id, l] : lp.top) top[token_name(id, vocab, as_ids)] = finite(l);
  logprobs["top_logprobs"].push_back(top);
  logprobs["text_offset"].push_back(text_offset);
}

nlohmann::json prompt_logprobs_json(const GenerationResult& r, const Vocab& vocab, bool as_ids) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& p : r.prompt_logprobs) {
    if (!p) {
      out.push_back(nullptr);
      continue;
    }
    nlohmann::json pos = nlohmann::json::object();
    pos[std::to_string(p->id)] = {{"logprob", finite(p->logprob)}, {"rank", p->rank}, {"decoded_token", token_name(p->id, vocab, as_ids)}};
    int rank = 1;
    for (const auto& [id, l] : p->top) {
      const std::string key = std::to_string(id);
      if (!pos.contains(key)) pos[key] = {{"logprob", finite(l)}, {"rank", rank}, {"decoded_token", token_name(id, vocab, as_ids)}};
      ++rank;
    }
    out.push_back(std::move(pos));
  }
  return out;
}

std::string_view api_finish_reason(FinishReason r) {
  return r == FinishReason::length ? "length" : "stop";
}

}  // namespace servedeck::worker
