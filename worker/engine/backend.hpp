// The compute backend seen by the engine: a forward pass over a sequence's KV cache.
// Implemented by the CPU reference (worker/cpu/) and the CUDA backend (worker/cuda/).
//
// Thread-safety: one forward() at a time per backend (the engine's scheduler thread owns it);
// a backend may use several threads internally.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace servedeck::worker {

/// A sequence's KV cache. Its byte size is fixed at creation (the explicit cap).
class KvCache {
 public:
  virtual ~KvCache() = default;
  /// Tokens stored, i.e. the position of the next token.
  virtual std::size_t length() const = 0;
  /// Capacity in tokens.
  virtual std::size_t capacity() const = 0;
  /// Drops positions >= n (n <= length()).
  virtual void truncate(std::size_t n) = 0;
};

/// Thrown when a forward pass would exceed the cache capacity; the message has both numbers.
struct KvCacheFull : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class Backend {
 public:
  virtual ~Backend() = default;

  /// Vocabulary size of the logits rows (config.json vocab_size).
  virtual std::size_t vocab_size() const = 0;
  /// Bytes of KV cache per token of context for this model (all layers, K and V).
  virtual std::size_t kv_bytes_per_token() const = 0;
  /// "cpu" or "cuda".
  virtual std::string name() const = 0;

  /// A cache holding up to `max_tokens` tokens.
  virtual std::unique_ptr<KvCache> new_cache(std::size_t max_tokens) = 0;

  /// Runs `tokens` at positions [cache.length(), cache.length() + n) and appends them to the
  /// cache. Returns logits, fp32, row-major: shape (n, vocab_size) when `all_logits`, else
  /// (1, vocab_size) for the last token. Throws KvCacheFull (nothing appended) when
  /// cache.length() + n > cache.capacity().
  virtual std::vector<float> forward(KvCache& cache, std::span<const int32_t> tokens,
                                     bool all_logits) = 0;

  /// Greedy decoding's step: runs `token` (in [0, vocab_size())) at position cache.length() as
  /// forward(cache, {token}, false) does, appending one position, and returns the index in
  /// [0, vocab_size()) of the largest logit of its row by worker::argmax's rule (sampler.hpp:
  /// lowest index on ties, NaN never picked). A backend may pick on its device and skip copying
  /// the row (the CUDA backend does). Default: forward + argmax; std::runtime_error when forward
  /// returns fewer than vocab_size() logits. Throws as forward: KvCacheFull (nothing appended)
  /// when the cache is full; the CUDA backend std::out_of_range for a token outside the vocabulary.
  virtual int32_t forward_greedy(KvCache& cache, int32_t token);
};

}  // namespace servedeck::worker
