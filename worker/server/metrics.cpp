#include "worker/server/metrics.hpp"

#include <sstream>

namespace servedeck::worker {

void Metrics::count_request(const std::string& route, int status) {
  std::lock_guard lock(mutex_);
  requests_[{route, status}]++;
}

std::string Metrics::render(const EngineStats* engine, bool loaded, double load_progress) const {
  std::ostringstream o;
  auto metric = [&](const char* name, const char* type, const char* help) {
    o << "# HELP " << name << ' ' << help << "\n# TYPE " << name << ' ' << type << '\n';
  };
  metric("servedeck_worker_requests_total", "counter", "HTTP requests answered, by route and status.");
  {
    std::lock_guard lock(mutex_);
    for (const auto& [key, n] : requests_)
      o << "servedeck_worker_requests_total{route=\"" << key.first << "\",status=\"" << key.second << "\"} " << n << '\n';
  }
  metric("servedeck_worker_model_loaded", "gauge", "1 once the model is loaded.");
  o << "servedeck_worker_model_loaded " << (loaded ? 1 : 0) << '\n';
  metric("servedeck_worker_load_progress", "gauge", "Model load progress, 0 to 1.");
  o << "servedeck_worker_load_progress " << load_progress << '\n';
  const EngineStats s = engine ? *engine : EngineStats{};
  metric("servedeck_worker_generations_total", "counter", "Generations finished (any reason).");
  o << "servedeck_worker_generations_total " << s.requests_finished << '\n';
  metric("servedeck_worker_prompt_tokens_total", "counter", "Prompt tokens of finished generations (cached or prefilled).");
  o << "servedeck_worker_prompt_tokens_total " << s.prompt_tokens << '\n';
  metric("servedeck_worker_prefix_cache_hit_tokens_total", "counter", "Prompt tokens reused from the prefix cache.");
  o << "servedeck_worker_prefix_cache_hit_tokens_total " << s.prefix_cache_hit_tokens << '\n';
  metric("servedeck_worker_prefix_cache_miss_tokens_total", "counter", "Prompt tokens prefilled (not found in the prefix cache).");
  o << "servedeck_worker_prefix_cache_miss_tokens_total " << s.prefix_cache_miss_tokens << '\n';
  metric("servedeck_worker_kv_blocks", "gauge", "KV pool blocks by state: held by the running request, cached (reusable, evictable), empty.");
  o << "servedeck_worker_kv_blocks{state=\"held\"} " << s.kv_blocks.held << '\n';
  o << "servedeck_worker_kv_blocks{state=\"cached\"} " << s.kv_blocks.cached << '\n';
  o << "servedeck_worker_kv_blocks{state=\"empty\"} " << s.kv_blocks.empty << '\n';
  metric("servedeck_worker_kv_block_tokens", "gauge", "Tokens per KV pool block.");
  o << "servedeck_worker_kv_block_tokens " << s.kv_pool.block_tokens << '\n';
  metric("servedeck_worker_kv_block_evictions_total", "counter", "Cached KV blocks evicted (least recently used) for new contents.");
  o << "servedeck_worker_kv_block_evictions_total " << s.kv_blocks.evictions << '\n';
  metric("servedeck_worker_generation_tokens_total", "counter", "Tokens generated.");
  o << "servedeck_worker_generation_tokens_total " << s.generation_tokens << '\n';
  metric("servedeck_worker_time_to_first_token_seconds", "summary", "Submit to first token, seconds.");
  o << "servedeck_worker_time_to_first_token_seconds_sum " << s.ttft_sum_s << '\n';
  o << "servedeck_worker_time_to_first_token_seconds_count " << s.requests_finished << '\n';
  metric("servedeck_worker_decode_seconds", "summary", "First to last token, seconds.");
  o << "servedeck_worker_decode_seconds_sum " << s.decode_sum_s << '\n';
  o << "servedeck_worker_decode_seconds_count " << s.requests_finished << '\n';
  metric("servedeck_worker_queue_depth", "gauge", "Requests waiting for the scheduler.");
  o << "servedeck_worker_queue_depth " << s.queued << '\n';
  metric("servedeck_worker_running", "gauge", "1 while a request is being generated.");
  o << "servedeck_worker_running " << (s.running ? 1 : 0) << '\n';
  return o.str();
}

}  // namespace servedeck::worker
