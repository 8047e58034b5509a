#include "policies/answer_rescue.hpp"

#include "policies/tag_markup.hpp"

namespace servedeck::policies {

bool split_stray_think(std::string& content, std::string& reasoning) {
  std::size_t pos = markup::stray_think_close(content);
  if (pos == std::string::npos) return false;
  std::string before(markup::trim(std::string_view(content).substr(0, pos)));
  std::string after = content.substr(pos + markup::kThinkClose.size());
  std::size_t lead = after.find_first_not_of(" \n\r\t");
  after = lead == std::string::npos ? std::string() : after.substr(lead);
  if (!before.empty()) reasoning += reasoning.empty() ? before : "\n" + before;
  content = std::move(after);
  return true;
}

bool reasoning_is_the_answer(std::string_view finish_reason, bool has_tool_calls, std::string_view content,
                             std::string_view reasoning, bool saw_think_close) {
  return finish_reason == "stop" && !has_tool_calls && markup::trim(content).empty() &&
         !markup::trim(reasoning).empty() && !saw_think_close;
}

}  // namespace servedeck::policies
