#include "worker/engine/engine.hpp"

#include <algorithm>
#include <exception>
#include <optional>
#include <stdexcept>
#include <utility>

#include "worker/engine/stop_matcher.hpp"

namespace servedeck::worker {

using clock_type = std::chrono::steady_clock;

namespace {
double seconds_between(clock_type::time_point a, clock_type::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}
}  // namespace

std::string_view to_string(FinishReason r) {
  switch (r) {
    case FinishReason::stop: return "stop";
    case FinishReason::length: return "length";
    case FinishReason::cancelled: return "cancelled";
    case FinishReason::error: return "error";
  }
  return "unknown";
}

bool prompt_opens_reasoning(std::span<const int32_t> prompt, std::optional<int32_t> think_start,
                            std::optional<int32_t> think_end) {
  if (!think_start || !think_end) return false;
  for (auto it = prompt.rbegin(); it != prompt.rend(); ++it) {
    if (*it == *think_end) return false;
    if (*it == *think_start) return true;
  }
  return false;
}

std::size_t kv_pool_blocks(std::size_t kv_cache_bytes, std::size_t kv_bytes_per_token, std::size_t block_tokens) {
  if (kv_bytes_per_token == 0 || block_tokens == 0) return 0;
  return kv_cache_bytes / kv_bytes_per_token / block_tokens;
}

std::optional<std::string> kv_cap_error(std::size_t prompt_tokens, std::size_t max_tokens, std::size_t kv_cache_bytes,
                                        std::size_t kv_bytes_per_token, std::size_t block_tokens) {
  const std::size_t capacity = kv_pool_blocks(kv_cache_bytes, kv_bytes_per_token, block_tokens) * block_tokens;
  const std::size_t need = prompt_tokens + max_tokens;
  if (need <= capacity) return std::nullopt;
  return "prompt " + std::to_string(prompt_tokens) + " tokens + max_tokens " + std::to_string(max_tokens) +
         " = " + std::to_string(need) + " tokens exceeds the KV cache capacity of " + std::to_string(capacity) +
         " tokens (--kv-cache-bytes " + std::to_string(kv_cache_bytes) + " / " +
         std::to_string(kv_bytes_per_token) + " bytes per token, in blocks of " + std::to_string(block_tokens) + " tokens)";
}

namespace {

KvPoolShape pool_shape(const Backend& backend, const EngineOptions& o) {
  if (o.prefill_chunk == 0) throw std::invalid_argument("prefill_chunk is 0; expected at least 1 token per chunk");
  if (o.kv_block_tokens == 0) throw std::invalid_argument("kv_block_tokens is 0; expected at least 1 token per block");
  const std::size_t per = backend.kv_bytes_per_token();
  const KvPoolShape shape{kv_pool_blocks(o.kv_cache_bytes, per, o.kv_block_tokens), o.kv_block_tokens};
  if (shape.num_blocks == 0)
    throw std::invalid_argument("--kv-cache-bytes " + std::to_string(o.kv_cache_bytes) + " holds no KV block: a block is " +
                                std::to_string(o.kv_block_tokens) + " tokens x " + std::to_string(per) +
                                " bytes per token = " + std::to_string(o.kv_block_tokens * per) + " bytes");
  return shape;
}

}  // namespace

Engine::Engine(Backend& backend, const Vocab& vocab, EngineOptions options)
    : backend_(backend),
      vocab_(vocab),
      options_(std::move(options)),
      pool_(pool_shape(backend, options_)),
      seq_(pool_, options_.prefix_caching) {
  backend_.allocate_kv_pool(pool_.shape());
  stats_.kv_pool = pool_.shape();
  stats_.kv_blocks = pool_.counts();
  stats_.kv_pool_allocations = backend_.kv_pool_allocations();
  thread_ = std::thread([this] { run(); });
}

Engine::~Engine() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
    if (current_) current_->cancel();
    for (auto& j : queue_) j.handle->cancel();
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

std::size_t Engine::kv_capacity_tokens() const { return pool_.shape().tokens(); }

std::optional<std::string> Engine::check(std::size_t prompt_tokens, std::size_t max_tokens) const {
  if (prompt_tokens == 0) return "the prompt is empty (0 tokens); expected at least 1 token";
  if (max_tokens == 0) return "max_tokens is 0; expected at least 1";
  const std::size_t need = prompt_tokens + max_tokens;
  if (options_.max_model_len > 0 && need > options_.max_model_len) {
    return "This model's maximum context length is " + std::to_string(options_.max_model_len) +
           " tokens. However, you requested " + std::to_string(need) + " tokens (" +
           std::to_string(prompt_tokens) + " in the prompt, " + std::to_string(max_tokens) +
           " in the completion). Please reduce the length of the prompt or max_tokens.";
  }
  return kv_cap_error(prompt_tokens, max_tokens, options_.kv_cache_bytes, backend_.kv_bytes_per_token(),
                      options_.kv_block_tokens);
}

std::optional<std::string> Engine::check(const LogitsAdjust& adjust) const {
  const std::size_t vocab = backend_.vocab_size();
  for (const auto& [id, bias] : adjust.bias)
    if (id < 0 || static_cast<std::size_t>(id) >= vocab)
      return "field 'logit_bias': token id " + std::to_string(id) + " is outside the vocabulary (" +
             std::to_string(vocab) + " logits: ids 0.." + std::to_string(vocab - 1) + ")";
  return std::nullopt;
}

std::shared_ptr<RequestHandle> Engine::submit(GenerationRequest request, EventCallback on_event,
                                              DoneCallback on_done,
                                              std::shared_ptr<RequestHandle> handle) {
  if (!handle) handle = std::make_shared<RequestHandle>();
  {
    std::lock_guard lock(mutex_);
    if (stopping_) handle->cancel();
    queue_.push_back(Job{std::move(request), std::move(on_event), std::move(on_done), handle, clock_type::now()});
  }
  cv_.notify_all();
  return handle;
}

EngineStats Engine::stats() const {
  std::lock_guard lock(mutex_);
  EngineStats s = stats_;
  s.queued = queue_.size();
  s.running = current_ != nullptr;
  return s;
}

void Engine::run() {
  for (;;) {
    Job job;
    {
      std::unique_lock lock(mutex_);
      cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping and drained
      job = std::move(queue_.front());
      queue_.pop_front();
      if (stopping_) job.handle->cancel();
      current_ = job.handle;
    }
    generate(job);
    std::lock_guard lock(mutex_);
    current_.reset();
  }
}

void Engine::publish_pool_counts() {
  const KvPoolCounts c = pool_.counts();
  std::lock_guard lock(mutex_);
  stats_.kv_blocks = c;
}

std::optional<std::string> Engine::reserve(std::size_t tokens) {
  const std::size_t had = seq_.room();
  if (!seq_.reserve(tokens)) {
    const KvPoolCounts c = pool_.counts();
    return "KV pool exhausted: " + std::to_string(tokens) + " positions need " +
           std::to_string((tokens + pool_.shape().block_tokens - 1) / pool_.shape().block_tokens) + " blocks; " +
           std::to_string(c.held) + " of " + std::to_string(pool_.shape().num_blocks) + " are held";
  }
  if (seq_.room() != had) publish_pool_counts();
  return std::nullopt;
}

std::optional<std::pair<FinishReason, std::string>> Engine::prefill(Job& job, GenerationResult& result,
                                                                    std::vector<float>& logits, std::size_t& forwards) {
  const GenerationRequest& req = job.request;
  const std::size_t vocab = backend_.vocab_size();
  const std::size_t n_prompt = req.prompt.size();
  const bool all = req.prompt_logprobs >= 0;
  // The prompt's last token always runs (its row is the first sample's), so at most n - 1
  // tokens come from the cache; prompt_logprobs need every row, so nothing does.
  result.cached_tokens = all ? 0 : seq_.attach_prefix(req.prompt, n_prompt - 1);
  publish_pool_counts();
  {
    std::lock_guard lock(mutex_);
    stats_.prefix_cache_hit_tokens += result.cached_tokens;
    stats_.prefix_cache_miss_tokens += n_prompt - result.cached_tokens;
  }
  if (all) result.prompt_logprobs.emplace_back(std::nullopt);
  const std::span<const int32_t> prompt(req.prompt);
  // Every row's logits come back for prompt_logprobs: bounded in bytes (EngineOptions).
  const std::size_t step =
      all ? std::min(options_.prefill_chunk, std::max<std::size_t>(1, options_.prompt_logits_bytes / (sizeof(float) * vocab)))
          : options_.prefill_chunk;
  for (std::size_t start = result.cached_tokens; start < n_prompt; start += step) {
    if (job.handle->cancelled()) return std::pair{FinishReason::cancelled, std::string()};
    const std::size_t n = std::min(step, n_prompt - start);
    const auto chunk = prompt.subspan(start, n);
    if (auto err = reserve(start + n)) return std::pair{FinishReason::error, "prefill failed: " + *err};
    try {
      logits = backend_.forward(seq_.view(), chunk, all);
    } catch (const std::exception& e) {
      return std::pair{FinishReason::error, std::string("prefill failed: ") + e.what()};
    }
    ++forwards;
    seq_.append(chunk);
    if (logits.size() < vocab * (all ? n : 1)) {
      return std::pair{FinishReason::error, "backend returned " + std::to_string(logits.size()) + " logits for a prefill chunk of " +
                                                std::to_string(n) + " tokens; expected rows of " + std::to_string(vocab)};
    }
    if (all) {
      // Row r predicts the token at start + r + 1.
      for (std::size_t r = 0; r < n && start + r + 1 < n_prompt; ++r) {
        std::span<const float> row(logits.data() + r * vocab, vocab);
        result.prompt_logprobs.emplace_back(token_logprob(row, req.prompt[start + r + 1], req.prompt_logprobs));
      }
      logits.erase(logits.begin(), logits.begin() + static_cast<std::ptrdiff_t>((n - 1) * vocab));
    }
  }
  return std::nullopt;
}

void Engine::generate(Job& job) {
  const auto started = clock_type::now();
  GenerationRequest& req = job.request;
  GenerationResult result;
  result.prompt_tokens = req.prompt.size();
  result.queue_s = seconds_between(job.submitted, started);
  std::size_t forwards = 0;

  auto finish = [&](FinishReason reason, std::string error = {}) {
    seq_.release();  // the blocks go back (full ones stay cached) before anyone hears it finished
    publish_pool_counts();
    result.finish = reason;
    result.error = std::move(error);
    {
      std::lock_guard lock(mutex_);
      stats_.requests_finished++;
      stats_.prompt_tokens += result.prompt_tokens;
      stats_.generation_tokens += result.completion_tokens;
      stats_.forward_calls += forwards;
      stats_.ttft_sum_s += result.ttft_s;
      stats_.decode_sum_s += result.decode_s;
      stats_.kv_pool_allocations = backend_.kv_pool_allocations();
      current_.reset();  // not running any more once anyone hears it finished
    }
    if (job.on_done) job.on_done(result);
  };

  if (job.handle->cancelled()) return finish(FinishReason::cancelled);
  if (auto err = check(req.prompt.size(), req.max_tokens)) return finish(FinishReason::error, *err);
  if (auto err = check(req.adjust)) return finish(FinishReason::error, *err);

  const std::size_t vocab = backend_.vocab_size();
  std::vector<float> logits;
  if (auto stopped = prefill(job, result, logits, forwards)) return finish(stopped->first, std::move(stopped->second));

  Sampler sampler(req.sampling);
  // Greedy without logprobs or logits changes needs only the pick: the backend may make it on its
  // device (Backend::forward_greedy) instead of returning the row. `picked` holds it between steps.
  const bool adjusting = req.adjust.active();
  const bool backend_picks = sampler.greedy() && req.logprobs < 0 && !adjusting;
  // Top-k sampling without logprobs or logits changes needs only the k best logits and the
  // argmax (Sampler::sample_top): the backend may select them on its device.
  const int top_k = req.sampling.top_k;
  const bool backend_selects = !sampler.greedy() && req.logprobs < 0 && !adjusting && top_k > 0 &&
                               static_cast<std::size_t>(top_k) < vocab && top_k <= backend_.max_top_k();
  std::optional<Backend::TopLogits> selected;  // the step's candidates when backend_selects
  std::optional<LogitsAdjuster> adjuster;
  std::vector<float> adjusted;  // the row the sampler reads when adjusting; logprobs read the raw one
  if (adjusting) adjuster.emplace(req.adjust, req.prompt, vocab);
  auto sample = [&]() -> int32_t {
    if (selected) return sampler.sample_top(selected->best, selected->argmax);
    if (!adjusting) return sampler.sample(std::span<const float>(logits.data(), vocab));
    adjusted.assign(logits.begin(), logits.begin() + static_cast<std::ptrdiff_t>(vocab));
    adjuster->apply(adjusted);
    return sampler.sample(adjusted);
  };
  // A token the backend chose on its device outside the vocabulary ends the request, naming it.
  auto outside = [&](int32_t id) { return id < 0 || static_cast<std::size_t>(id) >= vocab; };
  std::optional<int32_t> picked;
  StopMatcher stops(req.stop);
  Utf8Holdback utf8;
  bool in_reasoning = prompt_opens_reasoning(req.prompt, options_.think_start_id, options_.think_end_id);
  std::size_t reasoning_count = 0;
  clock_type::time_point first_token{};

  auto fail_outside = [&](const char* how, int32_t id) {
    result.decode_s = seconds_between(first_token, clock_type::now());
    return finish(FinishReason::error, std::string("backend ") + how + " token " + std::to_string(id) +
                                           " outside the vocabulary of " + std::to_string(vocab));
  };

  for (;;) {
    if (job.handle->cancelled()) {
      result.decode_s = result.completion_tokens ? seconds_between(first_token, clock_type::now()) : 0;
      return finish(FinishReason::cancelled);
    }
    const bool force_end = in_reasoning && req.thinking_token_budget && options_.think_end_id &&
                           reasoning_count >= *req.thinking_token_budget;
    const int32_t token = force_end ? *options_.think_end_id
                          : picked        ? *picked
                                          : sample();
    if (adjuster) adjuster->push(token);
    if (result.completion_tokens == 0) {
      first_token = clock_type::now();
      result.ttft_s = seconds_between(job.submitted, first_token);
    }
    result.completion_tokens++;
    // The budget counts tokens inside the block: not the opening or closing tag itself.
    if (options_.think_end_id && token == *options_.think_end_id) {
      in_reasoning = false;
    } else if (in_reasoning) {
      ++reasoning_count;
      result.reasoning_tokens++;
    } else if (options_.think_start_id && token == *options_.think_start_id) {
      in_reasoning = true;
    }

    GenerationEvent ev;
    ev.token = token;
    if (req.logprobs >= 0) ev.logprob = token_logprob(std::span<const float>(logits.data(), vocab), token, req.logprobs);

    const bool is_eos = !req.ignore_eos &&
                        std::find(options_.eos_ids.begin(), options_.eos_ids.end(), token) != options_.eos_ids.end();
    const bool is_stop_id = std::find(req.stop_token_ids.begin(), req.stop_token_ids.end(), token) != req.stop_token_ids.end();
    const bool limit = result.completion_tokens >= req.max_tokens;
    if (is_eos || is_stop_id) {
      ev.text = stops.push(utf8.flush());
      ev.text += stops.flush();
      result.stop_token = token;
      if (stops.stopped()) result.stop_string = stops.matched();
    } else {
      const std::string bytes = req.skip_special && vocab_.is_special(token) ? std::string() : vocab_.token_bytes(token);
      ev.text = stops.push(utf8.push(bytes));
      if (!stops.stopped() && limit) {
        ev.text += stops.push(utf8.flush());
        ev.text += stops.flush();
      }
    }
    if (job.on_event) job.on_event(ev);
    const auto now = clock_type::now();
    if (is_eos || is_stop_id || stops.stopped()) {
      result.decode_s = seconds_between(first_token, now);
      if (stops.stopped()) result.stop_string = stops.matched();
      return finish(FinishReason::stop);
    }
    if (limit) {
      result.decode_s = seconds_between(first_token, now);
      return finish(FinishReason::length);
    }
    if (auto err = reserve(seq_.length() + 1)) {
      result.decode_s = seconds_between(first_token, clock_type::now());
      return finish(FinishReason::error, "decode failed at token " + std::to_string(result.completion_tokens) + ": " + *err);
    }
    try {
      const int32_t one[1] = {token};
      if (backend_picks) {
        // The prefill's rows are not needed again.
        if (!picked) std::vector<float>().swap(logits);
        picked = backend_.forward_greedy(seq_.view(), token);
        ++forwards;
        seq_.append(one);
        if (outside(*picked)) return fail_outside("picked", *picked);
        continue;
      }
      if (backend_selects) {
        if (!selected) std::vector<float>().swap(logits);
        selected = backend_.forward_top_k(seq_.view(), token, top_k);
        ++forwards;
        seq_.append(one);
        for (const auto& [logit, id] : selected->best)
          if (outside(id)) return fail_outside("selected", id);
        if (outside(selected->argmax)) return fail_outside("picked", selected->argmax);
        continue;
      }
      logits = backend_.forward(seq_.view(), one, false);
      ++forwards;
      seq_.append(one);
      if (logits.size() < vocab) {
        return finish(FinishReason::error, "backend returned " + std::to_string(logits.size()) +
                                               " logits for one token; expected " + std::to_string(vocab));
      }
    } catch (const std::exception& e) {
      result.decode_s = seconds_between(first_token, clock_type::now());
      return finish(FinishReason::error, std::string("decode failed at token ") +
                                             std::to_string(result.completion_tokens) + ": " + e.what());
    }
  }
}

}  // namespace servedeck::worker
