#include "worker/server/tool_choice.hpp"

#include "worker/server/request_params.hpp"

namespace servedeck::worker {

namespace {

ToolChoiceError invalid(std::string message) { return {ToolChoiceErrorKind::invalid, std::move(message)}; }

ToolChoiceError unsupported(std::string message) { return {ToolChoiceErrorKind::unsupported, std::move(message)}; }

ToolChoiceError expected_got(const nlohmann::json& got) {
  return invalid("field 'tool_choice': expected \"auto\", \"none\", \"required\" or {\"type\": \"function\", \"function\": "
         "{\"name\": \"...\"}}, got " + describe_value(got));
}

std::string tool_names(const nlohmann::json& tools) {
  std::string names;
  if (!tools.is_array()) return names;
  for (const auto& t : tools) {
    if (!names.empty()) names += ", ";
    names += "'" + t["function"]["name"].get<std::string>() + "'";
  }
  return names;
}

}  // namespace

std::string_view to_string(ToolChoiceMode m) {
  switch (m) {
    case ToolChoiceMode::automatic: return "auto";
    case ToolChoiceMode::none: return "none";
    case ToolChoiceMode::required: return "required";
    case ToolChoiceMode::named: return "named";
  }
  return "unknown";
}

std::string_view to_string(ToolChoiceErrorKind k) {
  switch (k) {
    case ToolChoiceErrorKind::invalid: return "invalid_tool_choice";
    case ToolChoiceErrorKind::unsupported: return "unsupported_tool_choice";
  }
  return "invalid_tool_choice";
}

std::optional<ToolChoiceError> parse_tool_choice(const nlohmann::json& body, const nlohmann::json& tools,
                                                 ToolChoice& out) {
  out = ToolChoice{};
  const auto it = body.find("tool_choice");
  if (it == body.end() || it->is_null()) return std::nullopt;
  const bool have_tools = tools.is_array() && !tools.empty();
  if (it->is_string()) {
    const std::string s = it->get<std::string>();
    if (s == "auto") return std::nullopt;
    if (s == "none") {
      out.mode = ToolChoiceMode::none;
      return std::nullopt;
    }
    if (s == "required") {
      if (!have_tools)
        return invalid("field 'tool_choice': \"required\" needs a non-empty 'tools' array, and the request has none");
      out.mode = ToolChoiceMode::required;
      return std::nullopt;
    }
    return expected_got(*it);
  }
  if (!it->is_object()) return expected_got(*it);
  const auto type = it->find("type");
  const auto fn = it->find("function");
  if (type == it->end() || !type->is_string() || type->get<std::string>() != "function" || fn == it->end() ||
      !fn->is_object() || !fn->contains("name") || !(*fn)["name"].is_string())
    return expected_got(*it);
  const std::string name = (*fn)["name"].get<std::string>();
  if (!have_tools)
    return invalid("field 'tool_choice': names the function '" + name +
                   "', but the request has no 'tools'; expected one of the request's tools");
  for (const auto& t : tools) {
    if (t["function"]["name"].get<std::string>() == name) {
      out.mode = ToolChoiceMode::named;
      out.name = name;
      return std::nullopt;
    }
  }
  return invalid("field 'tool_choice': names the function '" + name + "', which is not one of the request's tools (" +
                 tool_names(tools) + ")");
}

std::optional<ToolChoiceError> forced_tool_call_prefix(const ToolChoice& choice, ToolParserKind kind,
                                                       bool prompt_opens_reasoning, std::string& prefix) {
  prefix.clear();
  if (choice.mode != ToolChoiceMode::required && choice.mode != ToolChoiceMode::named) return std::nullopt;
  const std::string what = choice.mode == ToolChoiceMode::required ? "tool_choice 'required'" : "a named tool_choice";
  std::string call;
  switch (kind) {
    case ToolParserKind::hermes:
      call = "<tool_call>\n";
      // note: the arguments' opening brace is forced too, so the parser sees the call's start
      // (and its name) even when the model's next tokens are not JSON; the arguments are an object.
      if (choice.mode == ToolChoiceMode::named)
        call += "{\"name\": " + nlohmann::json(choice.name).dump() + ", \"arguments\": {";
      break;
    case ToolParserKind::glm:
      call = "<tool_call>";
      if (choice.mode == ToolChoiceMode::named) {
        if (choice.name.empty() || choice.name.find_first_of("<>{}\" \t\r\n") != std::string::npos)
          return unsupported(what + ": the function name '" + choice.name +
                             "' cannot be written in the glm tool-call format (it is empty or holds whitespace or one "
                             "of <>{}\"); expected a name without them, or tool_choice \"auto\"");
        call += choice.name + "\n";
      }
      break;
    case ToolParserKind::qwen3_coder:
      call = "<tool_call>\n";
      if (choice.mode == ToolChoiceMode::named) {
        if (choice.name.empty() || choice.name.find_first_of("<>{}\" \t\r\n") != std::string::npos)
          return unsupported(what + ": the function name '" + choice.name +
                             "' cannot be written in the qwen3_coder tool-call format (it is empty or holds whitespace or "
                             "one of <>{}\"); expected a name without them, or tool_choice \"auto\"");
        call += "<function=" + choice.name + ">\n";
      }
      break;
    case ToolParserKind::none:
      return unsupported(what +
                         " is not supported for this model's tool-call format (--tool-parser none); expected \"auto\" or \"none\"");
  }
  prefix = (prompt_opens_reasoning ? "</think>\n\n" : "") + call;
  return std::nullopt;
}

}  // namespace servedeck::worker
