// The generation engine: a FIFO request queue served by one scheduler thread that owns the
// Backend. Requests run one at a time, to completion (prefill, then decode token by token);
// there is no batching across requests (note: the CPU reference saturates both cores on one
// sequence, so batching would not raise throughput there; the CUDA backend may add it later).
//
// Per request: a KV cache of exactly prompt + max_tokens tokens, refused up front when that
// exceeds the cache capacity (kv_cache_bytes / kv_bytes_per_token); sampling (sampler.hpp);
// stop strings (stop_matcher.hpp), EOS ids (generation_config.json) and stop_token_ids;
// max_tokens; logprobs/top_logprobs; prompt_logprobs; thinking_token_budget; cancellation.
//
// Threading: submit()/cancel() are thread-safe and called from any thread. The callbacks run on
// the scheduler thread, in order: on_event for each sampled token, then on_done exactly once
// (also for a request cancelled while queued, and for every pending request at shutdown).
// Callbacks must not block for long (they write to a socket queue) and must not call submit().
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "worker/engine/backend.hpp"
#include "worker/engine/sampler.hpp"
#include "worker/engine/vocab.hpp"

namespace servedeck::worker {

struct EngineOptions {
  std::size_t kv_cache_bytes = 0;       // --kv-cache-bytes: the whole cache budget, bytes
  std::size_t max_model_len = 0;        // --max-model-len, tokens (prompt + output)
  std::vector<int32_t> eos_ids;         // generation_config.json eos_token_id (int or list)
  std::optional<int32_t> think_start_id;  // "<think>" when the vocabulary has it
  std::optional<int32_t> think_end_id;    // "</think>": forced when thinking_token_budget is spent
};

struct GenerationRequest {
  std::vector<int32_t> prompt;                   // token ids, non-empty
  std::size_t max_tokens = 16;                   // generated tokens, >= 1
  SamplingParams sampling;
  std::vector<std::string> stop;                 // stop strings (never emitted)
  std::vector<int32_t> stop_token_ids;           // extra stop ids (their text not emitted)
  bool ignore_eos = false;
  bool skip_special = true;                      // special tokens' text not emitted (vLLM default)
  int logprobs = -1;                             // -1: none; n >= 0: token logprob + top n
  int prompt_logprobs = -1;                      // -1: none; n >= 0: per prompt position
  std::optional<std::size_t> thinking_token_budget;  // tokens inside the reasoning block
};

/// One sampled token's contribution to the output.
struct GenerationEvent {
  std::string text;                          // emitted text (may be empty: held back or special)
  int32_t token = 0;
  std::optional<TokenLogprob> logprob;       // when logprobs >= 0
};

enum class FinishReason { stop, length, cancelled, error };
std::string_view to_string(FinishReason r);

struct GenerationResult {
  FinishReason finish = FinishReason::stop;
  std::string error;                         // finish == error: what failed
  std::string stop_string;                   // the stop string that matched, if any
  std::optional<int32_t> stop_token;         // the EOS/stop id that ended it, if any
  std::size_t prompt_tokens = 0;
  std::size_t completion_tokens = 0;         // sampled tokens, including a final EOS
  std::size_t reasoning_tokens = 0;          // of which inside the reasoning block
  /// prompt_logprobs >= 0: one entry per prompt position; the first is nullopt (no context).
  std::vector<std::optional<TokenLogprob>> prompt_logprobs;
  double queue_s = 0;                        // submit → start
  double ttft_s = 0;                         // submit → first token sampled
  double decode_s = 0;                       // first token → last token
};

using EventCallback = std::function<void(const GenerationEvent&)>;
using DoneCallback = std::function<void(const GenerationResult&)>;

/// Handle to a submitted request. cancel() is thread-safe; the scheduler checks the flag between
/// tokens, stops, frees the request's KV cache, and calls on_done with FinishReason::cancelled.
class RequestHandle {
 public:
  void cancel() { cancelled_.store(true); }
  bool cancelled() const { return cancelled_.load(); }

 private:
  std::atomic<bool> cancelled_{false};
};

/// Counters for /metrics and tests (monotonic unless noted).
struct EngineStats {
  std::size_t requests_finished = 0;
  std::size_t prompt_tokens = 0;
  std::size_t generation_tokens = 0;
  std::size_t forward_calls = 0;
  std::size_t queued = 0;      // now
  bool running = false;        // now: a request is being generated
  double ttft_sum_s = 0;
  double decode_sum_s = 0;
};

/// True when the last "<think>" in `prompt` comes after the last "</think>" (the template left a
/// reasoning block open). False when the ids are unknown.
bool prompt_opens_reasoning(std::span<const int32_t> prompt, std::optional<int32_t> think_start,
                            std::optional<int32_t> think_end);

/// The KV cap check: nullopt when prompt + max_tokens fits `capacity_tokens`, else the message
/// naming both numbers, e.g. "prompt 812 tokens + max_tokens 4096 = 4908 tokens exceeds the KV
/// cache capacity of 4096 tokens (--kv-cache-bytes 1048576 / 256 bytes per token)".
std::optional<std::string> kv_cap_error(std::size_t prompt_tokens, std::size_t max_tokens,
                                        std::size_t kv_cache_bytes, std::size_t kv_bytes_per_token);

class Engine {
 public:
  /// `backend` and `vocab` must outlive the engine. Starts the scheduler thread.
  Engine(Backend& backend, const Vocab& vocab, EngineOptions options);
  /// Stops the scheduler: the running request is cancelled, queued ones end as cancelled.
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  /// Tokens the KV cache holds: kv_cache_bytes / kv_bytes_per_token (the per-request cap).
  std::size_t kv_capacity_tokens() const;
  const EngineOptions& options() const { return options_; }

  /// Checks a request against the KV cap and max_model_len; nullopt when it fits, else the
  /// client error message (HTTP 400) with the numbers.
  std::optional<std::string> check(std::size_t prompt_tokens, std::size_t max_tokens) const;

  /// Queues a request (which must pass check(); otherwise it finishes with FinishReason::error).
  /// `handle` lets the caller create the handle first (so a disconnect callback registered
  /// before submit() can cancel); null → a new one. Returns the handle.
  std::shared_ptr<RequestHandle> submit(GenerationRequest request, EventCallback on_event,
                                        DoneCallback on_done,
                                        std::shared_ptr<RequestHandle> handle = nullptr);

  EngineStats stats() const;

 private:
  struct Job {
    GenerationRequest request;
    EventCallback on_event;
    DoneCallback on_done;
    std::shared_ptr<RequestHandle> handle;
    std::chrono::steady_clock::time_point submitted;
  };

  void run();
  void generate(Job& job);

  Backend& backend_;
  const Vocab& vocab_;
  EngineOptions options_;

  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<Job> queue_;
  bool stopping_ = false;
  std::shared_ptr<RequestHandle> current_;
  EngineStats stats_;
  std::thread thread_;
};

}  // namespace servedeck::worker
