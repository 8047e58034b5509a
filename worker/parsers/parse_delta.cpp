#include "worker/parsers/parse_delta.hpp"

#include <algorithm>

namespace servedeck::worker {

std::string_view to_string(DeltaKind k) {
  switch (k) {
    case DeltaKind::content: return "content";
    case DeltaKind::reasoning: return "reasoning";
    case DeltaKind::tool_call_start: return "tool_call_start";
    case DeltaKind::tool_call_arguments: return "tool_call_arguments";
  }
  return "unknown";
}

void fold(const std::vector<ParseDelta>& deltas, ParsedOutput& out) {
  for (const auto& d : deltas) {
    switch (d.kind) {
      case DeltaKind::content: out.content += d.text; break;
      case DeltaKind::reasoning: out.reasoning += d.text; break;
      case DeltaKind::tool_call_start:
        out.tool_calls.push_back(ParsedToolCall{d.id, d.name, ""});
        break;
      case DeltaKind::tool_call_arguments:
        if (d.tool_index >= 0 && static_cast<std::size_t>(d.tool_index) < out.tool_calls.size())
          out.tool_calls[static_cast<std::size_t>(d.tool_index)].arguments += d.text;
        break;
    }
  }
}

void append_text(std::vector<ParseDelta>& out, DeltaKind kind, std::string_view text) {
  if (text.empty()) return;
  if (!out.empty() && out.back().kind == kind) {
    out.back().text += text;
    return;
  }
  ParseDelta d;
  d.kind = kind;
  d.text = std::string(text);
  out.push_back(std::move(d));
}

std::size_t partial_tag_suffix(std::string_view buf, std::string_view tag) {
  const std::size_t max_len = std::min(buf.size(), tag.size() == 0 ? 0 : tag.size() - 1);
  for (std::size_t len = max_len; len > 0; --len) {
    if (buf.substr(buf.size() - len) == tag.substr(0, len)) return len;
  }
  return 0;
}

}  // namespace servedeck::worker
