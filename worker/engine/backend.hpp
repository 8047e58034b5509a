// The compute backend seen by the engine: a forward pass over one sequence's K/V in the
// backend's paged KV pool. Implemented by the CPU reference (worker/cpu/) and the CUDA backend
// (worker/cuda/); both read and write every position through the block table.
//
// The KV pool: `num_blocks` blocks of `block_tokens` token rows, allocated once at start
// (allocate_kv_pool). A row holds one token's K and V for every layer. Which blocks a sequence
// uses is the engine's business (kv_block_pool.hpp): it passes the sequence's block table with
// each forward pass, so several sequences, and cached prefixes shared between requests, live in
// the one pool. The backend only reads and writes rows through the table it is given.
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
#include <string_view>
#include <utility>
#include <vector>

namespace servedeck::worker {

/// Element type of stored K/V. bf16: round to nearest even from the fp32 the backend computes
/// (half the bytes; the serving default). f32: exact (the CPU reference's comparison against
/// transformers, docs/correctness.md).
enum class KvDtype { bf16, f32 };
std::string_view to_string(KvDtype d);
/// Bytes of one element: 2 (bf16) or 4 (f32).
std::size_t kv_dtype_bytes(KvDtype d);

/// Shape of the KV pool.
struct KvPoolShape {
  std::size_t num_blocks = 0;    // blocks in the pool
  std::size_t block_tokens = 0;  // token rows per block
  std::size_t tokens() const { return num_blocks * block_tokens; }
};

/// One sequence's K/V as a forward pass sees it: position p lives in row p % block_tokens of
/// pool block blocks[p / block_tokens]; positions [0, length) hold the K/V of the sequence's
/// tokens so far. The pass writes positions [length, length + n) and reads [0, length + n).
struct KvView {
  std::span<const int32_t> blocks;  // block ids in [0, num_blocks), one per block_tokens positions
  std::size_t length = 0;           // positions already stored, tokens
};

/// Thrown when a forward pass would write past the room its sequence has (its blocks); nothing
/// is written. The message has both numbers.
struct KvCacheFull : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class Backend {
 public:
  virtual ~Backend() = default;

  /// Vocabulary size of the logits rows (config.json vocab_size).
  virtual std::size_t vocab_size() const = 0;
  /// Bytes of stored K/V per token of context (all layers, K and V, the backend's KvDtype):
  /// the engine sizes the pool as --kv-cache-bytes / this.
  virtual std::size_t kv_bytes_per_token() const = 0;
  /// "cpu" or "cuda".
  virtual std::string name() const = 0;

  /// Allocates the KV pool's storage, shape.tokens() * kv_bytes_per_token() bytes, and drops any
  /// earlier pool (its contents are gone). Called once at start by the engine; forward() before
  /// it throws std::logic_error. Throws std::invalid_argument for a shape with no blocks or no
  /// rows per block, or one the backend cannot read (the CUDA backend's attention reads blocks
  /// of a multiple of 16 rows), and the allocator's error (std::bad_alloc, CudaError) when
  /// memory is short.
  virtual void allocate_kv_pool(const KvPoolShape& shape) = 0;
  /// How many times this backend allocated KV storage since it was made: 1 after start, and it
  /// stays 1 however many requests run (the test of "no allocation per request").
  virtual std::size_t kv_pool_allocations() const = 0;

  /// Runs `tokens` (each in [0, vocab_size())) at positions [kv.length, kv.length + n), writing
  /// their K/V through kv.blocks. Returns logits, fp32, row-major: shape (n, vocab_size) when
  /// `all_logits`, else (1, vocab_size) for the last token. Throws KvCacheFull (nothing written)
  /// when kv.blocks.size() * block_tokens < kv.length + n; std::out_of_range for a token outside
  /// the vocabulary or a block id outside the pool. The caller advances its length.
  virtual std::vector<float> forward(const KvView& kv, std::span<const int32_t> tokens, bool all_logits) = 0;

  /// Greedy decoding's step: runs `token` at position kv.length as forward(kv, {token}, false)
  /// does and returns the index in [0, vocab_size()) of the largest logit of its row by
  /// worker::argmax's rule (sampler.hpp: lowest index on ties, NaN never picked). A backend may
  /// pick on its device and skip copying the row (the CUDA backend does). Default: forward +
  /// argmax; std::runtime_error when forward returns fewer than vocab_size() logits. Throws as
  /// forward.
  virtual int32_t forward_greedy(const KvView& kv, int32_t token);

  /// Top-k sampling's step: runs `token` as forward_greedy does and returns what Sampler::
  /// sample_top needs of its row: the min(k, finite) best logits by top_logits' rule (sampler.hpp)
  /// and the row's argmax. k in [1, max_top_k()]; std::invalid_argument otherwise. A backend may
  /// select them on its device and skip copying the row (the CUDA backend does). Default:
  /// forward + top_logits + argmax; std::runtime_error when forward returns fewer than
  /// vocab_size() logits. Throws as forward.
  struct TopLogits {
    std::vector<std::pair<float, int32_t>> best;  // (logit, id), best first
    int32_t argmax = 0;
  };
  virtual TopLogits forward_top_k(const KvView& kv, int32_t token, int k);
  /// The largest k forward_top_k takes (the default's: any up to the vocabulary).
  virtual int max_top_k() const { return static_cast<int>(vocab_size()); }
};

}  // namespace servedeck::worker
