// The outer loop the tool-call formats that wrap a call in <tool_call>…</tool_call> share
// (hermes, glm, qwen3_coder): content outside the block passes through, holding back bytes that
// may start "<tool_call>"; the block's body is handed to the format's body handler, which
// consumes it incrementally and says when the block closed. Internal to worker/parsers.
//
// Not thread-safe: one parser per completion.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "worker/parsers/tool_call_parser.hpp"

namespace servedeck::worker::detail {

inline constexpr std::string_view k_open = "<tool_call>";
inline constexpr std::string_view k_close = "</tool_call>";

/// `s` without leading and trailing spaces, tabs, CR and LF.
inline std::string_view trim(std::string_view s) {
  const auto ws = " \t\r\n";
  const auto b = s.find_first_not_of(ws);
  if (b == std::string_view::npos) return {};
  const auto e = s.find_last_not_of(ws);
  return s.substr(b, e - b + 1);
}

/// Compact JSON text; invalid UTF-8 in strings is replaced (U+FFFD), never thrown on.
inline std::string dump(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// Shared outer loop: content outside <tool_call>…</tool_call> passes through; the block body is
// handed to the format's body handler.
class BlockParser : public ToolCallParser {
 public:
  explicit BlockParser(ToolCallIdGenerator ids) : ids_(std::move(ids)) {}

  void push(std::string_view text, std::vector<ParseDelta>& out) override {
    buf_ += text;
    for (;;) {
      if (!in_block_) {
        const auto pos = buf_.find(k_open);
        if (pos == std::string::npos) {
          const std::size_t hold = partial_tag_suffix(buf_, k_open);
          append_text(out, DeltaKind::content, std::string_view(buf_).substr(0, buf_.size() - hold));
          buf_.erase(0, buf_.size() - hold);
          return;
        }
        append_text(out, DeltaKind::content, std::string_view(buf_).substr(0, pos));
        buf_.erase(0, pos + k_open.size());
        in_block_ = true;
        raw_block_.clear();
        begin_block();
      }
      // In a block: buf_ holds the unconsumed body.
      if (!on_body(out, /*at_end=*/false)) return;  // needs more text
      in_block_ = false;
    }
  }

  void finish(std::vector<ParseDelta>& out) override {
    if (in_block_) {
      on_body(out, /*at_end=*/true);
      in_block_ = false;
    } else {
      append_text(out, DeltaKind::content, buf_);
    }
    buf_.clear();
  }

  int calls() const override { return calls_; }

 protected:
  virtual void begin_block() = 0;
  /// Consumes from buf_; returns true when the block is closed (buf_ then holds what follows).
  virtual bool on_body(std::vector<ParseDelta>& out, bool at_end) = 0;

  int start_call(std::vector<ParseDelta>& out, std::string name) {
    ParseDelta d;
    d.kind = DeltaKind::tool_call_start;
    d.tool_index = calls_;
    d.id = ids_();
    d.name = std::move(name);
    out.push_back(std::move(d));
    return calls_++;
  }
  static void add_args(std::vector<ParseDelta>& out, int index, std::string text) {
    ParseDelta d;
    d.kind = DeltaKind::tool_call_arguments;
    d.tool_index = index;
    d.text = std::move(text);
    out.push_back(std::move(d));
  }

  std::string buf_;
  std::string raw_block_;  // body consumed so far (to release as content when it fails to parse)
  bool in_block_ = false;

 private:
  ToolCallIdGenerator ids_;
  int calls_ = 0;
};

}  // namespace servedeck::worker::detail
