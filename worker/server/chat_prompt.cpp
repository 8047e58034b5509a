#include "worker/server/chat_prompt.hpp"

#include <exception>

#include "common/json_limits.hpp"
#include "worker/server/request_params.hpp"

namespace servedeck::worker {

namespace {

using Failure = std::optional<ChatPromptError>;

Failure bad(std::string msg) { return ChatPromptError{400, std::move(msg), "invalid_messages", ""}; }

/// An assistant turn's tool_calls as the chat templates read them: an array of
/// {"id"?: string, "type"?: "function", "function": {"name": string, "arguments": object}}, each
/// `arguments` string that holds a JSON object replaced by the object (templates iterate it);
/// any other shape is the client's 400, named by its path (a template would fail on it).
/// Arguments are parsed within common/json_limits.hpp's bounds (a string is not depth-checked
/// with the body).
Failure normalize_tool_calls(nlohmann::json& calls, const std::string& where) {
  if (!calls.is_array()) return bad(where + ": expected an array of tool calls, got " + describe_value(calls));
  for (std::size_t k = 0; k < calls.size(); ++k) {
    auto& tc = calls[k];
    const std::string cw = where + "[" + std::to_string(k) + "]";
    if (!tc.is_object())
      return bad(cw + ": expected {\"id\": \"...\", \"type\": \"function\", \"function\": {\"name\": \"...\", \"arguments\": \"...\"}}, got " +
                 describe_value(tc));
    if (tc.contains("id") && !tc["id"].is_null() && !tc["id"].is_string())
      return bad(cw + ".id: expected a string, got " + describe_value(tc["id"]));
    if (!tc.contains("function") || !tc["function"].is_object())
      return bad(cw + ".function: expected an object with a string `name`, got " +
                 (tc.contains("function") ? describe_value(tc["function"]) : std::string("nothing")));
    auto& f = tc["function"];
    if (!f.contains("name") || !f["name"].is_string())
      return bad(cw + ".function.name: expected a string, got " + (f.contains("name") ? describe_value(f["name"]) : std::string("nothing")));
    if (!f.contains("arguments") || f["arguments"].is_null()) {
      f["arguments"] = nlohmann::json::object();
    } else if (f["arguments"].is_string()) {
      auto parsed = parse_untrusted(f["arguments"].get<std::string>());
      if (!parsed.is_discarded() && parsed.is_object()) f["arguments"] = std::move(parsed);
    } else if (!f["arguments"].is_object()) {
      return bad(cw + ".function.arguments: expected a JSON-encoded string or an object, got " + describe_value(f["arguments"]));
    }
  }
  return std::nullopt;
}

Failure normalize_message(nlohmann::json& m, std::size_t i) {
  const std::string where = "messages[" + std::to_string(i) + "]";
  if (!m.is_object()) return bad(where + ": expected an object, got " + describe_value(m));
  if (!m.contains("role") || !m["role"].is_string())
    return bad(where + ".role: expected a string (system, user, assistant, tool), got " +
               (m.contains("role") ? describe_value(m["role"]) : std::string("nothing")));
  if (m.contains("content")) {
    auto& c = m["content"];
    if (c.is_array()) {
      std::string joined;
      for (std::size_t k = 0; k < c.size(); ++k) {
        const auto& part = c[k];
        const std::string pw = where + ".content[" + std::to_string(k) + "]";
        if (!part.is_object() || !part.contains("type") || !part["type"].is_string())
          return bad(pw + ": expected {\"type\": \"text\", \"text\": \"...\"}, got " + describe_value(part));
        const std::string type = part["type"].get<std::string>();
        if (type != "text" && type != "input_text")
          return bad(pw + ": content part type '" + type + "' is not supported; this model takes text parts only");
        if (!part.contains("text") || !part["text"].is_string())
          return bad(pw + ".text: expected a string, got " + (part.contains("text") ? describe_value(part["text"]) : "nothing"));
        joined += part["text"].get<std::string>();
      }
      c = joined;
    } else if (c.is_null()) {
      // note: OpenAI clients send `content: null` on assistant tool-call turns; templates written
      // for transformers test it with string operations (`'</think>' in content`), so null and a
      // missing content are rendered as "" (as vLLM does).
      c = "";
    } else if (!c.is_string()) {
      return bad(where + ".content: expected a string, an array of text parts or null, got " + describe_value(c));
    }
  } else {
    m["content"] = "";
  }
  {
    static const char* const k_roles[] = {"system", "user", "assistant", "tool", "developer"};
    const std::string role = m["role"].get<std::string>();
    bool known = false;
    for (const char* r : k_roles) known = known || role == r;
    if (!known) return bad(where + ".role: '" + role + "' is not a chat role; expected system, user, assistant, tool or developer");
  }
  if (m.contains("tool_calls") && m["tool_calls"].is_null()) m.erase("tool_calls");
  if (m.contains("tool_calls")) return normalize_tool_calls(m["tool_calls"], where + ".tool_calls");
  return std::nullopt;
}

}  // namespace

Failure build_chat_prompt(const nlohmann::json& body, const TextModel& text, ChatPrompt& out) {
  if (!body.contains("messages")) return bad("field 'messages' is missing; expected an array of messages");
  nlohmann::json messages = body["messages"];
  if (!messages.is_array() || messages.empty())
    return bad("field 'messages': expected a non-empty array, got " + describe_value(messages));
  for (std::size_t i = 0; i < messages.size(); ++i) {
    if (auto f = normalize_message(messages[i], i)) return f;
  }
  nlohmann::json context = nlohmann::json::object();
  if (auto it = body.find("chat_template_kwargs"); it != body.end() && !it->is_null()) {
    if (!it->is_object()) return bad("field 'chat_template_kwargs': expected an object, got " + describe_value(*it));
    for (const auto& [k, v] : it->items()) context[k] = v;
  }
  context["messages"] = std::move(messages);
  bool add_generation_prompt = true;
  if (auto it = body.find("add_generation_prompt"); it != body.end() && !it->is_null()) {
    if (!it->is_boolean()) return bad("field 'add_generation_prompt': expected true or false, got " + describe_value(*it));
    add_generation_prompt = it->get<bool>();
  }
  context["add_generation_prompt"] = add_generation_prompt;
  out.tools = nullptr;
  out.tools_enabled = false;
  if (auto it = body.find("tools"); it != body.end() && !it->is_null()) {
    if (!it->is_array()) return bad("field 'tools': expected an array of tools, got " + describe_value(*it));
    for (std::size_t i = 0; i < it->size(); ++i) {
      const auto& t = (*it)[i];
      if (!t.is_object() || !t.contains("function") || !t["function"].is_object() ||
          !t["function"].contains("name") || !t["function"]["name"].is_string())
        return bad("tools[" + std::to_string(i) + "]: expected {\"type\": \"function\", \"function\": {\"name\": ...}}, got " +
                   describe_value(t));
    }
    if (!it->empty()) {
      out.tools = *it;
      context["tools"] = *it;
      out.tools_enabled = true;
    }
  }
  if (auto e = parse_tool_choice(body, out.tools, out.tool_choice))
    return ChatPromptError{400, std::move(e->message), std::string(to_string(e->kind)), "tool_choice"};
  if (out.tool_choice.mode == ToolChoiceMode::none) out.tools_enabled = false;
  try {
    out.text = text.render_chat(context);
  } catch (const ChatRenderError& e) {
    return bad(std::string("chat template: ") + e.what());
  } catch (const std::exception& e) {
    return ChatPromptError{500, std::string("chat template failed: ") + e.what(), "template_failed", ""};
  }
  out.tokens = text.encode(out.text);
  return std::nullopt;
}

}  // namespace servedeck::worker
