// The generation engine: a FIFO request queue served by one scheduler thread that owns the
// Backend. Requests run one at a time, to completion (prefill, then decode token by token);
// there is no batching across requests (note: the CPU reference saturates both cores on one
// sequence, so batching would not raise throughput there; the CUDA backend may add it later).
//
// The KV pool: kv_cache_bytes / (kv_bytes_per_token × kv_block_tokens) blocks, allocated by the
// backend once, in the constructor (Backend::allocate_kv_pool); requests take blocks from it as
// they grow (kv_sequence.hpp) and give them back when they end. Full blocks stay cached after
// their request: a request reuses the longest cached prefix of its token ids (kv_block_pool.hpp,
// chained block keys as vLLM's automatic prefix caching) and prefills only the rest; cached
// blocks no running request holds are evicted least recently used first when blocks run out.
// A request is refused up front when prompt + max_tokens exceeds the pool's tokens.
//
// Prefill runs in chunks of prefill_chunk tokens, the cancellation flag checked between chunks
// (a client that disconnects stops a long prefill); the chunks after a cached prefix start at
// its length (positions, hence RoPE and the causal mask, are the sequence's). A request with
// prompt_logprobs recomputes its whole prompt (logits of the cached part are not kept).
//
// Per request also: sampling (sampler.hpp); stop strings (stop_matcher.hpp), EOS ids
// (generation_config.json) and stop_token_ids; max_tokens; logprobs/top_logprobs;
// prompt_logprobs; thinking_token_budget; cancellation.
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
#include "worker/engine/kv_block_pool.hpp"
#include "worker/engine/kv_sequence.hpp"
#include "worker/engine/logits_adjust.hpp"
#include "worker/engine/sampler.hpp"
#include "worker/engine/vocab.hpp"

namespace servedeck::worker {

struct EngineOptions {
  std::size_t kv_cache_bytes = 0;       // --kv-cache-bytes: the whole KV pool, bytes
  std::size_t max_model_len = 0;        // --max-model-len, tokens (prompt + output)
  /// Tokens per KV block. note: 16 (vLLM's default on CUDA): a prefix is reused in whole
  /// blocks, so a turn recomputes at most 15 tokens it could have reused, and a sequence wastes
  /// at most 15 rows; a 150K-token context is a table of ~9.4K block ids. Larger blocks would
  /// only shorten the tables; the attention reads rows through the table either way.
  std::size_t kv_block_tokens = 16;
  /// --prefill-chunk: prompt tokens per forward pass of the prefill, >= 1. note: 4096 is the
  /// CUDA backend's own prefill chunk (it stages every routed expert once per chunk, so an
  /// offloaded prefill's PCIe bytes grow with the number of chunks); smaller chunks stop sooner
  /// when the client leaves.
  std::size_t prefill_chunk = 4096;
  /// Most bytes of fp32 logits one prefill pass returns for a prompt_logprobs request (every
  /// prompt row's logits, not only the last): such a prefill runs in passes of at most
  /// max(1, prompt_logits_bytes / (4 * vocab)) tokens when that is below prefill_chunk.
  /// note: 4096 rows of Qwen3's 151936-token vocabulary would be 2.5 GB at once (host and
  /// device); 256 MiB is 441 rows there, and cancellation is checked between the passes.
  std::size_t prompt_logits_bytes = std::size_t{256} << 20;
  /// Reuse cached prefixes across requests (the default). false: every request prefills its
  /// whole prompt into private blocks and nothing is published (the benchmark's baseline,
  /// bench/agent_loop).
  bool prefix_caching = true;
  std::vector<int32_t> eos_ids;         // generation_config.json eos_token_id (int or list)
  std::optional<int32_t> think_start_id;  // "<think>" when the vocabulary has it
  std::optional<int32_t> think_end_id;    // "</think>": forced when thinking_token_budget is spent
};

struct GenerationRequest {
  std::vector<int32_t> prompt;                   // token ids, non-empty
  std::size_t max_tokens = 16;                   // generated tokens, >= 1
  SamplingParams sampling;
  LogitsAdjust adjust;                           // logit_bias and penalties, before sampling
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
  std::size_t cached_tokens = 0;             // of which reused from the prefix cache, not prefilled
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
/// prefill chunks and between tokens, stops, gives the request's blocks back to the pool (the
/// full ones stay cached), and calls on_done with FinishReason::cancelled.
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
  std::size_t prefix_cache_hit_tokens = 0;   // prompt tokens reused from the prefix cache
  std::size_t prefix_cache_miss_tokens = 0;  // prompt tokens prefilled (of requests that started)
  std::size_t generation_tokens = 0;
  std::size_t forward_calls = 0;
  std::size_t queued = 0;      // now
  bool running = false;        // now: a request is being generated
  double ttft_sum_s = 0;
  double decode_sum_s = 0;
  KvPoolShape kv_pool;         // the pool's shape
  KvPoolCounts kv_blocks;      // now (evictions: monotonic)
  std::size_t kv_pool_allocations = 0;  // Backend::kv_pool_allocations: 1 after start
};

/// True when the last "<think>" in `prompt` comes after the last "</think>" (the template left a
/// reasoning block open). False when the ids are unknown.
bool prompt_opens_reasoning(std::span<const int32_t> prompt, std::optional<int32_t> think_start,
                            std::optional<int32_t> think_end);

/// Blocks of `block_tokens` tokens that `kv_cache_bytes` hold at `kv_bytes_per_token`
/// (rounded down; 0 when either is 0).
std::size_t kv_pool_blocks(std::size_t kv_cache_bytes, std::size_t kv_bytes_per_token, std::size_t block_tokens);

/// The KV cap check: nullopt when prompt + max_tokens fits the pool's tokens (whole blocks),
/// else the message naming both numbers, e.g. "prompt 812 tokens + max_tokens 4096 = 4908
/// tokens exceeds the KV cache capacity of 4096 tokens (--kv-cache-bytes 1048576 / 256 bytes
/// per token, in blocks of 16 tokens)".
std::optional<std::string> kv_cap_error(std::size_t prompt_tokens, std::size_t max_tokens, std::size_t kv_cache_bytes,
                                        std::size_t kv_bytes_per_token, std::size_t block_tokens);

class Engine {
 public:
  /// `backend` and `vocab` must outlive the engine. Allocates the KV pool (Backend::
  /// allocate_kv_pool) and starts the scheduler thread. Throws std::invalid_argument when
  /// kv_cache_bytes holds no whole block or prefill_chunk / kv_block_tokens is 0, and the
  /// backend's allocation errors.
  Engine(Backend& backend, const Vocab& vocab, EngineOptions options);
  /// Stops the scheduler: the running request is cancelled, queued ones end as cancelled.
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  /// Tokens the KV pool holds: its blocks × kv_block_tokens (also the per-request cap).
  std::size_t kv_capacity_tokens() const;
  const EngineOptions& options() const { return options_; }

  /// Checks a request against the KV cap and max_model_len; nullopt when it fits, else the
  /// client error message (HTTP 400) with the numbers.
  std::optional<std::string> check(std::size_t prompt_tokens, std::size_t max_tokens) const;
  /// Checks a request's logits changes against the backend's logits row: nullopt when every
  /// logit_bias id is in [0, vocab), else the client error message (HTTP 400) naming the id.
  std::optional<std::string> check(const LogitsAdjust& adjust) const;

  /// Queues a request (which must pass both checks; otherwise it finishes with FinishReason::error).
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
  /// Prefills req.prompt after the cached prefix in chunks; fills `logits` with the last row
  /// (and result.prompt_logprobs). Returns the finish reason and message when it stopped early.
  std::optional<std::pair<FinishReason, std::string>> prefill(Job& job, GenerationResult& result,
                                                              std::vector<float>& logits, std::size_t& forwards);
  /// Blocks for `tokens` positions of the running sequence; the message when the pool has
  /// none left (cannot happen to a request that passed check() while it runs alone).
  std::optional<std::string> reserve(std::size_t tokens);
  /// Copies the pool's counts into stats_ (under the lock) for stats().
  void publish_pool_counts();

  Backend& backend_;
  const Vocab& vocab_;
  EngineOptions options_;
  // Owned by the scheduler thread once it runs.
  KvBlockPool pool_;
  KvSequence seq_;      // the running request's blocks, reused request after request

  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<Job> queue_;
  bool stopping_ = false;
  std::shared_ptr<RequestHandle> current_;
  EngineStats stats_;
  std::thread thread_;
};

}  // namespace servedeck::worker
