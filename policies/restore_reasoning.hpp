// restore_reasoning (issue 7 §4; seed notes, "Client compatibility").
//
// OpenAI-style clients never echo `reasoning_content`, so GLM's template renders every prior
// assistant turn as an empty <think></think>; the model reads its own blank thinking and greets
// the user mid-task (4.5% of agent turns measured over 3,898 transcript turns; a logprob probe put
// 3.32% of the mass on that continuation, 0.00% with reasoning restored). The response side
// remembers each assistant turn's reasoning; the request side puts it back as
// `reasoning_content` on the matching assistant message (never into `content`). Counted as
// "restore_reasoning". Shipped OFF for GLM (an open decision in the notes), tested on.
//
// Keys of a turn: "id:<tool_call id>" for each tool call, and "h:<FNV-1a 64 hex>" of its
// normalised content (whitespace runs collapsed, trimmed) plus each tool call's name and
// compact-serialised arguments; the hash key is skipped when that text is empty (every empty
// turn would collide). Lookup tries the ids first, then the hash.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "policies/pipeline.hpp"

namespace servedeck::policies {

/// Bounded, expiring, thread-safe map from assistant turns to their reasoning. All public
/// methods lock one internal mutex; safe from any thread.
class ReasoningStore {
 public:
  using Clock = std::chrono::steady_clock;
  struct Options {
    std::size_t max_entries = 4096;                    // keys held; oldest evicted first
    std::size_t max_bytes = 64u * 1024 * 1024;         // reasoning text held, bytes (shared per turn)
    std::chrono::seconds ttl = std::chrono::hours(6);  // an entry expires this long after it was stored
    std::function<Clock::time_point()> now;            // tests inject a clock; default Clock::now
  };

  ReasoningStore();
  explicit ReasoningStore(Options options);

  /// Stores `reasoning` for the assistant turn `message` (an OpenAI assistant message: content,
  /// tool_calls). No-op when the reasoning is empty or the turn has no key.
  void remember(const nlohmann::json& message, const std::string& reasoning);

  /// The reasoning stored for `message`, when present and not expired.
  std::optional<std::string> recall(const nlohmann::json& message);

  /// Keys currently held (expired ones included until the next call that prunes).
  std::size_t size() const;

  /// The keys of a turn, as described above. Exposed for tests.
  static std::vector<std::string> keys_of(const nlohmann::json& message);

 private:
  struct Entry {
    std::shared_ptr<const std::string> text;
    Clock::time_point expires;
    std::list<std::string>::iterator order;
  };
  Clock::time_point now() const;
  void prune_locked(Clock::time_point now);

  Options options_;
  mutable std::mutex mutex_;
  std::unordered_map<std::string, Entry> entries_;
  std::list<std::string> order_;  // oldest first
  std::size_t bytes_ = 0;         // approximate: each key counts its text once
};

/// Request side: restores reasoning on assistant messages that lack it. Never fails.
void apply_restore_reasoning(nlohmann::json& body, RequestContext& ctx);

}  // namespace servedeck::policies
