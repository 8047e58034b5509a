#include "policies/restore_reasoning.hpp"

#include <cstdint>
#include <cstdio>

#include "policies/flatten_content.hpp"
#include "policies/json_util.hpp"
#include "policies/reasoning_dialects.hpp"
#include "policies/repair_count.hpp"

namespace servedeck::policies {
namespace {

using json = nlohmann::json;

std::string collapse_whitespace(std::string_view s) {
  std::string out;
  bool space = false;
  for (char c : s) {
    if (c == ' ' || c == '\n' || c == '\t' || c == '\r') {
      space = !out.empty();
      continue;
    }
    if (space) out.push_back(' ');
    space = false;
    out.push_back(c);
  }
  return out;
}

// FNV-1a, 64-bit (offset basis 14695981039346656037, prime 1099511628211).
std::string fnv1a_hex(std::string_view s) {
  uint64_t h = 14695981039346656037ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

std::string content_text(const json& message) {
  if (!message.contains("content")) return {};
  const auto& c = message["content"];
  if (c.is_string()) return c.get<std::string>();
  if (auto joined = join_text_parts(c)) return *joined;
  return {};
}

}  // namespace

ReasoningStore::ReasoningStore() : ReasoningStore(Options{}) {}

ReasoningStore::ReasoningStore(Options options) : options_(std::move(options)) {}

ReasoningStore::Clock::time_point ReasoningStore::now() const {
  return options_.now ? options_.now() : Clock::now();
}

std::vector<std::string> ReasoningStore::keys_of(const json& message) {
  std::vector<std::string> keys;
  if (!message.is_object()) return keys;
  std::string normalised = collapse_whitespace(content_text(message));
  if (message.contains("tool_calls") && message["tool_calls"].is_array()) {
    for (const auto& tc : message["tool_calls"]) {
      if (!tc.is_object()) continue;
      if (tc.contains("id") && tc["id"].is_string() && !tc["id"].get<std::string>().empty()) {
        keys.push_back("id:" + tc["id"].get<std::string>());
      }
      if (tc.contains("function") && tc["function"].is_object()) {
        const auto& f = tc["function"];
        normalised += "\n" + string_field(f, "name");
        if (f.contains("arguments")) {
          json args = f["arguments"];
          if (args.is_string()) {
            auto parsed = parse_untrusted(args.get<std::string>());
            args = parsed.is_discarded() ? json(collapse_whitespace(args.get<std::string>())) : parsed;
          }
          normalised += " " + dump_safe(args);
        }
      }
    }
  }
  if (!normalised.empty()) keys.push_back("h:" + fnv1a_hex(normalised));
  return keys;
}

void ReasoningStore::prune_locked(Clock::time_point t) {
  while (!order_.empty()) {
    auto it = entries_.find(order_.front());
    bool expired = it != entries_.end() && it->second.expires <= t;
    bool over = entries_.size() > options_.max_entries || bytes_ > options_.max_bytes;
    if (!expired && !over) break;
    if (it != entries_.end()) {
      bytes_ -= it->second.text->size();
      entries_.erase(it);
    }
    order_.pop_front();
  }
}

void ReasoningStore::remember(const json& message, const std::string& reasoning) {
  if (reasoning.empty()) return;
  auto keys = keys_of(message);
  if (keys.empty()) return;
  auto text = std::make_shared<const std::string>(reasoning);
  std::lock_guard lock(mutex_);
  auto t = now();
  for (const auto& k : keys) {
    if (auto it = entries_.find(k); it != entries_.end()) {
      bytes_ -= it->second.text->size();
      order_.erase(it->second.order);
      entries_.erase(it);
    }
    order_.push_back(k);
    entries_[k] = Entry{text, t + options_.ttl, std::prev(order_.end())};
    bytes_ += text->size();
  }
  prune_locked(t);
}

std::optional<std::string> ReasoningStore::recall(const json& message) {
  auto keys = keys_of(message);
  std::lock_guard lock(mutex_);
  auto t = now();
  prune_locked(t);
  for (const auto& k : keys) {
    auto it = entries_.find(k);
    if (it != entries_.end() && it->second.expires > t) return *it->second.text;
  }
  return std::nullopt;
}

std::size_t ReasoningStore::size() const {
  std::lock_guard lock(mutex_);
  return entries_.size();
}

void apply_restore_reasoning(json& body, RequestContext& ctx) {
  if (!ctx.model || !ctx.model->policies.restore_reasoning || !ctx.reasoning_store || !body.is_object()) return;
  if (!body.contains("messages") || !body["messages"].is_array()) return;
  int restored = 0;
  for (auto& m : body["messages"]) {
    if (!m.is_object() || string_field(m, "role") != "assistant") continue;
    auto existing = reasoning_of(m);
    if (existing && !existing->empty()) continue;
    if (auto r = ctx.reasoning_store->recall(m)) {
      m.erase("reasoning");
      m["reasoning_content"] = *r;
      count_repair(ctx, "restore_reasoning");
      ++restored;
    }
  }
  if (restored > 0) log_note(ctx, "restore_reasoning", "restored reasoning on " + std::to_string(restored) + " assistant turn(s)");
}

}  // namespace servedeck::policies
