// Test doubles for the engine and the server: a paged Backend whose logits are a deterministic
// function of the context it reads back through the block table (a hash, plus an optional
// scripted peak so greedy decoding follows a known text), and a byte-level Vocab with a few
// special and multi-byte tokens.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "worker/engine/backend.hpp"
#include "worker/engine/vocab.hpp"

namespace servedeck::worker::testing {

// Ids: 0..255 = single bytes; then the specials and multi-byte pieces below.
inline constexpr int32_t k_eos = 256;          // "<|im_end|>" special
inline constexpr int32_t k_think = 257;        // "<think>"
inline constexpr int32_t k_think_end = 258;    // "</think>"
inline constexpr int32_t k_im_start = 259;     // "<|im_start|>" special
inline constexpr int32_t k_piece_he = 260;     // "He"
inline constexpr int32_t k_piece_llo_st = 261; // "llo ST"
inline constexpr int32_t k_piece_op = 262;     // "OP!"
inline constexpr int32_t k_fake_vocab = 263;

class FakeVocab final : public Vocab {
 public:
  std::string token_bytes(int32_t id) const override {
    if (id >= 0 && id < 256) return std::string(1, static_cast<char>(id));
    switch (id) {
      case k_eos: return "<|im_end|>";
      case k_think: return "<think>";
      case k_think_end: return "</think>";
      case k_im_start: return "<|im_start|>";
      case k_piece_he: return "He";
      case k_piece_llo_st: return "llo ST";
      case k_piece_op: return "OP!";
      default: return {};
    }
  }
  bool is_special(int32_t id) const override { return id == k_eos || id == k_im_start; }

  /// Greedy longest-match encoding over the multi-byte pieces and tags, else bytes.
  std::vector<int32_t> encode(std::string_view text) const {
    std::vector<int32_t> out;
    std::size_t i = 0;
    while (i < text.size()) {
      int32_t best = -1;
      std::size_t best_len = 0;
      for (int32_t id = 256; id < k_fake_vocab; ++id) {
        const std::string t = token_bytes(id);
        if (t.size() > best_len && text.substr(i, t.size()) == t) {
          best = id;
          best_len = t.size();
        }
      }
      if (best >= 0) {
        out.push_back(best);
        i += best_len;
      } else {
        out.push_back(static_cast<unsigned char>(text[i]));
        ++i;
      }
    }
    return out;
  }
  std::string decode(const std::vector<int32_t>& ids, bool skip_special = false) const {
    std::string s;
    for (int32_t id : ids)
      if (!(skip_special && is_special(id))) s += token_bytes(id);
    return s;
  }
};

/// Scripted next token for a context, or -1 for "no preference" (hash logits only).
using Script = std::function<int32_t(const std::vector<int32_t>& context)>;

/// A paged backend whose "K/V" is the token id itself: each pool row stores the id written at
/// that position, and a forward pass reads the sequence's context back through the block table
/// it is given. Logits are a function of that context, so a wrong block table (a reused block
/// with other tokens, a chunk at the wrong position) changes them.
class FakeBackend final : public Backend {
 public:
  explicit FakeBackend(Script script = {}, std::size_t bytes_per_token = 256)
      : script_(std::move(script)), bytes_per_token_(bytes_per_token) {}

  std::size_t vocab_size() const override { return k_fake_vocab; }
  std::size_t kv_bytes_per_token() const override { return bytes_per_token_; }
  std::string name() const override { return "fake"; }

  void allocate_kv_pool(const KvPoolShape& shape) override {
    if (shape.num_blocks == 0 || shape.block_tokens == 0) throw std::invalid_argument("fake pool: empty shape");
    shape_ = shape;
    rows_.assign(shape.tokens(), -1);
    ++pool_allocations;
  }
  std::size_t kv_pool_allocations() const override { return pool_allocations; }

  std::vector<float> forward(const KvView& kv, std::span<const int32_t> tokens, bool all_logits) override {
    if (rows_.empty()) throw std::logic_error("fake forward before allocate_kv_pool");
    const std::size_t end = kv.length + tokens.size();
    if (end > kv.blocks.size() * shape_.block_tokens)
      throw KvCacheFull("fake cache full: " + std::to_string(end) + " > " + std::to_string(kv.blocks.size() * shape_.block_tokens));
    if (delay_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
    if (fail_after_calls >= 0 && forward_calls.load() >= static_cast<std::size_t>(fail_after_calls))
      throw std::runtime_error("fake backend failure after " + std::to_string(fail_after_calls) + " forward calls");
    ++forward_calls;
    {
      std::lock_guard lock(passes_mutex_);
      passes_.push_back({kv.length, tokens.size()});
    }
    for (std::size_t i = 0; i < tokens.size(); ++i) row(kv, kv.length + i) = tokens[i];
    std::vector<int32_t> ctx;
    for (std::size_t pos = 0; pos < end; ++pos) ctx.push_back(row(kv, pos));
    std::vector<float> out;
    const std::size_t first = all_logits ? kv.length : end - 1;
    for (std::size_t pos = first; pos < end; ++pos) {
      auto r = logits_for(std::vector<int32_t>(ctx.begin(), ctx.begin() + static_cast<std::ptrdiff_t>(pos + 1)));
      out.insert(out.end(), r.begin(), r.end());
    }
    return out;
  }

  /// Counts the engine's greedy steps; returns `bad_pick` when it is set (a backend's malformed
  /// pick), else the default's forward + argmax.
  int32_t forward_greedy(const KvView& kv, int32_t token) override {
    ++greedy_calls;
    const int32_t picked = Backend::forward_greedy(kv, token);
    return bad_pick ? *bad_pick : picked;
  }

  /// Counts the engine's top-k steps; the default's forward + top_logits + argmax.
  TopLogits forward_top_k(const KvView& kv, int32_t token, int k) override {
    ++top_k_calls;
    return Backend::forward_top_k(kv, token, k);
  }

  /// (start position, tokens) of every forward pass so far.
  std::vector<std::pair<std::size_t, std::size_t>> passes() const {
    std::lock_guard lock(passes_mutex_);
    return passes_;
  }
  void clear_passes() {
    std::lock_guard lock(passes_mutex_);
    passes_.clear();
  }

  /// Deterministic logits for a context: FNV-1a hash of the ids seeds a xorshift generator.
  std::vector<float> logits_for(const std::vector<int32_t>& ctx) const {
    uint64_t h = 1469598103934665603ull;
    for (int32_t t : ctx) {
      h ^= static_cast<uint32_t>(t);
      h *= 1099511628211ull;
    }
    std::vector<float> row(k_fake_vocab);
    for (auto& x : row) {
      h ^= h << 13;
      h ^= h >> 7;
      h ^= h << 17;
      x = static_cast<float>(h % 1000) / 250.0f;  // [0, 4)
    }
    if (script_) {
      const int32_t want = script_(ctx);
      if (want >= 0 && want < k_fake_vocab) row[static_cast<std::size_t>(want)] = 20.0f;
    }
    return row;
  }

  std::atomic<std::size_t> pool_allocations{0};
  std::atomic<std::size_t> forward_calls{0};
  int delay_ms = 0;
  std::atomic<int> fail_after_calls{-1};  // >= 0: forward() throws once this many calls were made
  std::atomic<std::size_t> greedy_calls{0};  // forward_greedy calls
  std::atomic<std::size_t> top_k_calls{0};   // forward_top_k calls
  std::optional<int32_t> bad_pick;           // set before submitting: forward_greedy returns this id

 private:
  int32_t& row(const KvView& kv, std::size_t pos) {
    const int32_t block = kv.blocks[pos / shape_.block_tokens];
    if (block < 0 || static_cast<std::size_t>(block) >= shape_.num_blocks)
      throw std::out_of_range("fake: block " + std::to_string(block) + " outside the pool");
    return rows_[static_cast<std::size_t>(block) * shape_.block_tokens + pos % shape_.block_tokens];
  }

  Script script_;
  std::size_t bytes_per_token_;
  KvPoolShape shape_;
  std::vector<int32_t> rows_;  // (num_blocks × block_tokens) the token id stored at each pool row
  mutable std::mutex passes_mutex_;
  std::vector<std::pair<std::size_t, std::size_t>> passes_;
};

/// A script that makes greedy decoding produce `answer` (as token ids) after the prompt of
/// length `prompt_len`, then EOS; tokens beyond it follow the hash.
inline Script scripted_answer(std::vector<int32_t> answer, bool eos_after = true) {
  return [answer = std::move(answer), eos_after](const std::vector<int32_t>& ctx) -> int32_t {
    // Find how much of the answer is already at the end of the context: the script restarts
    // after the last special token (the prompt ends in a special or a known marker in tests).
    std::size_t start = 0;
    for (std::size_t i = ctx.size(); i > 0; --i) {
      if (ctx[i - 1] == k_im_start) {
        start = i;
        break;
      }
    }
    // Skip the prompt's own tokens after the marker: the answer begins after the first "\n".
    std::size_t j = start;
    while (j < ctx.size() && ctx[j] != '\n') ++j;
    if (j >= ctx.size()) return -1;
    const std::size_t produced = ctx.size() - (j + 1);
    if (produced < answer.size()) return answer[produced];
    return eos_after ? k_eos : -1;
  };
}

}  // namespace servedeck::worker::testing
