// Reasoning split: text between <think> and </think> becomes reasoning_content, the rest content.
// Streaming-safe: bytes that may be the start of a tag are held back until the next piece decides
// them, so no delta ever carries part of a tag.
//
// "starts_in_reasoning": the chat template already opened the block (Qwen3 with thinking on after
// a <think> in the generation prompt, GLM): output begins as reasoning, and an opening tag that the
// model repeats anyway is dropped. Otherwise output begins as content and <think> opens the block.
// Tags toggle: after </think> a later <think> opens a new block.
//
// Not thread-safe: one parser per completion.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "worker/parsers/parse_delta.hpp"

namespace servedeck::worker {

class ReasoningParser {
 public:
  /// `enabled` false: everything is content (--reasoning-parser none).
  ReasoningParser(bool enabled, bool starts_in_reasoning, std::string open_tag = "<think>",
                  std::string close_tag = "</think>");

  /// Consumes `text`; appends content/reasoning deltas to `out`.
  void push(std::string_view text, std::vector<ParseDelta>& out);
  /// End of output: releases held bytes (as text of the current kind).
  void finish(std::vector<ParseDelta>& out);

  bool in_reasoning() const { return in_reasoning_; }

 private:
  bool enabled_;
  bool in_reasoning_;
  bool at_start_;  // starts_in_reasoning and nothing decided yet: a leading open tag is dropped
  std::string open_;
  std::string close_;
  std::string buf_;
};

}  // namespace servedeck::worker
