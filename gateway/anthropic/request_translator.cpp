#include "gateway/anthropic/request_translator.hpp"

#include <algorithm>
#include <cctype>
#include <cstdint>

#include "common/json_field_types.hpp"
#include "common/json_limits.hpp"

namespace servedeck::gateway::anthropic {

using nlohmann::json;

namespace {

/// A string field of an object, or "" (never throws on a wrong type).
std::string str(const json& j, const char* key) {
  if (!j.is_object()) return {};
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
}

/// `text` cut to at most 64 bytes (never inside a UTF-8 character, "…" appended when cut), for
/// quoting a client's value in an error.
std::string cut_for_error(const std::string& text) {
  constexpr std::size_t k_max = 64;
  if (text.size() <= k_max) return text;
  std::size_t end = k_max;
  while (end > 0 && (static_cast<unsigned char>(text[end]) & 0xC0) == 0x80) --end;
  return text.substr(0, end) + "…";
}

const json* field(const json& j, const char* key) {
  if (!j.is_object()) return nullptr;
  auto it = j.find(key);
  return it == j.end() || it->is_null() ? nullptr : &*it;
}

std::string where(std::size_t m, std::size_t b) {
  return "messages." + std::to_string(m) + ".content." + std::to_string(b);
}

/// An Anthropic image block → a chat `image_url` part (base64 sources as a data: URL).
std::optional<json> image_part(const json& block) {
  const json* src = field(block, "source");
  if (!src || !src->is_object()) return std::nullopt;
  const std::string type = str(*src, "type");
  if (type == "base64")
    return json{{"type", "image_url"},
                {"image_url", {{"url", "data:" + str(*src, "media_type") + ";base64," + str(*src, "data")}}}};
  if (type == "url") return json{{"type", "image_url"}, {"image_url", {{"url", str(*src, "url")}}}};
  return std::nullopt;
}

/// A plain-text document block's text appended to `text` (other sources are refused: the
/// engines servedeck runs read no PDF or file).
std::optional<TranslateError> document_text(const json& block, const std::string& at, std::string& text) {
  const json* src = field(block, "source");
  const json* data = src ? field(*src, "data") : nullptr;
  if (!src || str(*src, "type") != "text")
    return TranslateError{at + ": document blocks other than plain text (source.type \"text\") are not "
                          "supported by the engines servedeck runs"};
  if (data && !data->is_string())
    return TranslateError{at + ".source.data: expected a string, got " + std::string(data->type_name())};
  if (!text.empty()) text += "\n";
  text += str(*src, "data");
  return std::nullopt;
}

/// Text of a tool_result's `content`: a string, or blocks whose text (and plain-text document)
/// blocks are joined by "\n"; image blocks go to `images` as chat parts. A block of the wrong
/// shape is the client's 400, an image without vision too; other block types are dropped with
/// a warning.
std::optional<TranslateError> tool_result_text(const json& content, const std::string& at,
                                               const TranslateOptions& opt, TranslatedRequest& out, std::string& text,
                                               json& images) {
  if (content.is_null()) return std::nullopt;
  if (content.is_string()) {
    text = content.get<std::string>();
    return std::nullopt;
  }
  if (!content.is_array()) return TranslateError{at + ".content: expected a string or an array of blocks"};
  for (std::size_t i = 0; i < content.size(); ++i) {
    const json& b = content[i];
    const std::string bat = at + ".content." + std::to_string(i);
    if (!b.is_object()) return TranslateError{bat + ": expected a content block object, got " + b.type_name()};
    const std::string type = str(b, "type");
    if (type == "text") {
      if (const json* t = field(b, "text"); t && !t->is_string())
        return TranslateError{bat + ".text: expected a string, got " + t->type_name()};
      if (!text.empty()) text += "\n";
      text += str(b, "text");
    } else if (type == "image") {
      if (!opt.vision)
        return TranslateError{bat + ": an image in a tool result needs a model with vision; model '" + opt.model_name +
                              "' has none (registry key `vision`)"};
      auto part = image_part(b);
      if (!part) return TranslateError{bat + ".source: expected {type: base64, media_type, data} or {type: url, url}"};
      images.push_back(*part);
    } else if (type == "document") {
      if (auto e = document_text(b, bat, text)) return e;
    } else {
      out.warnings.push_back("dropped " + bat + " of type '" + type + "'");
    }
  }
  return std::nullopt;
}

/// A text block's `text` when it is no string (a number, an object): the client's 400, named.
std::optional<TranslateError> mistyped_text(const json& block, std::size_t m, std::size_t b) {
  const json* t = field(block, "text");
  if (!t || t->is_string()) return std::nullopt;
  return TranslateError{where(m, b) + ".text: expected a string, got " + t->type_name()};
}

/// Chat content from text parts and image parts: a string when there is no image.
json chat_content(const std::string& text, const json& images) {
  if (images.empty()) return text;
  json parts = json::array();
  if (!text.empty()) parts.push_back({{"type", "text"}, {"text", text}});
  for (const auto& p : images) parts.push_back(p);
  return parts;
}

/// One user message: tool_result blocks become `tool` messages (first, in block order: they
/// answer the assistant turn before), the other blocks one user message after them.
std::optional<TranslateError> user_message(const json& content, std::size_t m, const TranslateOptions& opt,
                                           TranslatedRequest& out, json& messages) {
  if (content.is_string()) {
    messages.push_back({{"role", "user"}, {"content", content}});
    return std::nullopt;
  }
  std::string text;
  json images = json::array();
  for (std::size_t b = 0; b < content.size(); ++b) {
    const json& block = content[b];
    if (!block.is_object()) return TranslateError{where(m, b) + ": expected a content block object"};
    const std::string type = str(block, "type");
    if (type == "text") {
      if (auto e = mistyped_text(block, m, b)) return e;
      if (!text.empty()) text += "\n";
      text += str(block, "text");
    } else if (type == "image") {
      if (!opt.vision)
        return TranslateError{where(m, b) + ": image blocks need a model with vision; model '" + opt.model_name +
                              "' has none (registry key `vision`)"};
      auto part = image_part(block);
      if (!part) return TranslateError{where(m, b) + ".source: expected {type: base64, media_type, data} or {type: url, url}"};
      images.push_back(*part);
    } else if (type == "tool_result") {
      const std::string id = str(block, "tool_use_id");
      if (id.empty()) return TranslateError{where(m, b) + ": a tool_result needs a string `tool_use_id`"};
      std::string result;
      json result_images = json::array();
      if (const json* c = field(block, "content"))
        if (auto err = tool_result_text(*c, where(m, b), opt, out, result, result_images)) return err;
      const json* is_error = field(block, "is_error");
      // note: chat completions have no error flag on a tool message; the model reads it in the text.
      if (is_error && is_error->is_boolean() && is_error->get<bool>()) result = "Error: " + result;
      messages.push_back({{"role", "tool"}, {"tool_call_id", id}, {"content", result}});
      for (const auto& part : result_images) images.push_back(part);
    } else if (type == "document") {
      if (auto e = document_text(block, where(m, b), text)) return e;
    } else {
      out.warnings.push_back("dropped " + where(m, b) + " of type '" + type + "'");
    }
  }
  if (!text.empty() || !images.empty()) messages.push_back({{"role", "user"}, {"content", chat_content(text, images)}});
  return std::nullopt;
}

std::optional<TranslateError> assistant_message(const json& content, std::size_t m, TranslatedRequest& out,
                                                json& messages) {
  if (content.is_string()) {
    messages.push_back({{"role", "assistant"}, {"content", content}});
    return std::nullopt;
  }
  std::string text, reasoning;
  json calls = json::array();
  for (std::size_t b = 0; b < content.size(); ++b) {
    const json& block = content[b];
    if (!block.is_object()) return TranslateError{where(m, b) + ": expected a content block object"};
    const std::string type = str(block, "type");
    if (type == "text") {
      if (auto e = mistyped_text(block, m, b)) return e;
      text += str(block, "text");
    } else if (type == "thinking") {
      // The signature is servedeck's own (stream_translator.hpp: thinking_signature) or another
      // provider's: either way the text goes back to the template as the turn's reasoning.
      if (const json* v = field(block, "thinking"); v && !v->is_string())
        return TranslateError{where(m, b) + ".thinking: expected a string, got " + v->type_name()};
      if (!reasoning.empty()) reasoning += "\n";
      reasoning += str(block, "thinking");
    } else if (type == "redacted_thinking") {
      out.warnings.push_back("dropped " + where(m, b) + ": redacted_thinking has no text an engine could read");
    } else if (type == "tool_use") {
      const std::string id = str(block, "id"), name = str(block, "name");
      if (id.empty() || name.empty()) return TranslateError{where(m, b) + ": a tool_use needs string `id` and `name`"};
      const json* input = field(block, "input");
      if (input && !input->is_object())
        return TranslateError{where(m, b) + ".input: expected an object (the tool's arguments), got " + input->type_name()};
      const std::string args = input ? dump_safe(*input) : std::string("{}");
      calls.push_back({{"id", id}, {"type", "function"}, {"function", {{"name", name}, {"arguments", args}}}});
    } else {
      out.warnings.push_back("dropped " + where(m, b) + " of type '" + type + "'");
    }
  }
  json msg = {{"role", "assistant"}, {"content", text}};
  if (!reasoning.empty()) msg["reasoning_content"] = reasoning;
  if (!calls.empty()) msg["tool_calls"] = std::move(calls);
  if (text.empty() && reasoning.empty() && !msg.contains("tool_calls")) return std::nullopt;  // nothing left
  messages.push_back(std::move(msg));
  return std::nullopt;
}

/// The system prompt: a string, or text blocks joined by "\n" (billing header blocks removed).
std::optional<TranslateError> system_text(const json& system, const TranslateOptions& opt, TranslatedRequest& out,
                                          std::string& text) {
  if (system.is_string()) {
    text = system.get<std::string>();
    if (opt.strip_billing_header && is_billing_header(text)) {
      const auto nl = text.find('\n');
      text = nl == std::string::npos ? std::string() : text.substr(nl + 1);
      ++out.billing_blocks_removed;
    }
    return std::nullopt;
  }
  if (!system.is_array()) return TranslateError{"system: expected a string or an array of text blocks"};
  for (std::size_t i = 0; i < system.size(); ++i) {
    const json& b = system[i];
    if (!b.is_object() || str(b, "type") != "text")
      return TranslateError{"system." + std::to_string(i) + ": expected a text block {type: \"text\", text}"};
    if (const json* v = field(b, "text"); v && !v->is_string())
      return TranslateError{"system." + std::to_string(i) + ".text: expected a string, got " + v->type_name()};
    const std::string t = str(b, "text");
    if (opt.strip_billing_header && is_billing_header(t)) {
      ++out.billing_blocks_removed;
      continue;
    }
    if (!text.empty()) text += "\n";
    text += t;
  }
  return std::nullopt;
}

/// Client tools → chat function tools; typed (server) tools dropped with a warning. An
/// `input_schema` that is no object is the client's 400 (a tool without one takes no arguments).
std::optional<TranslateError> translate_tools(const json& tools, TranslatedRequest& out) {
  json chat_tools = json::array();
  for (std::size_t i = 0; i < tools.size(); ++i) {
    const json& t = tools[i];
    const std::string type = str(t, "type"), name = str(t, "name");
    // Client tools have no type or type "custom"; typed ones (web_search_20250305, bash_20250124,
    // text_editor_…, computer_…) are Anthropic's server or built-in tools.
    if (!t.is_object() || name.empty() || (!type.empty() && type != "custom")) {
      out.warnings.push_back("dropped tools." + std::to_string(i) + (name.empty() ? "" : " '" + name + "'") +
                             (type.empty() ? std::string(": not a named tool") : " of type '" + type + "'") +
                             " (the engine cannot run it)");
      continue;
    }
    json fn = {{"name", name}};
    if (const json* d = field(t, "description"); d && d->is_string()) fn["description"] = *d;
    const json* schema = field(t, "input_schema");
    if (schema && !schema->is_object())
      return TranslateError{"tools." + std::to_string(i) + ".input_schema: expected an object (a JSON Schema), got " +
                            schema->type_name()};
    fn["parameters"] = schema ? *schema : json{{"type", "object"}, {"properties", json::object()}};
    chat_tools.push_back({{"type", "function"}, {"function", std::move(fn)}});
  }
  if (!chat_tools.empty()) out.chat["tools"] = std::move(chat_tools);
  return std::nullopt;
}

void translate_tool_choice(const json& tc, TranslatedRequest& out) {
  const std::string type = str(tc, "type");
  if (type == "auto") out.chat["tool_choice"] = "auto";
  else if (type == "any") out.chat["tool_choice"] = "required";
  else if (type == "none") out.chat["tool_choice"] = "none";
  else if (type == "tool" && !str(tc, "name").empty())
    out.chat["tool_choice"] = {{"type", "function"}, {"function", {{"name", str(tc, "name")}}}};
  else out.warnings.push_back("ignored tool_choice of an unsupported shape");
  if (const json* p = field(tc, "disable_parallel_tool_use"); p && p->is_boolean() && p->get<bool>())
    out.chat["parallel_tool_calls"] = false;
}

/// thinking → the model's reasoning switch (chat_template_kwargs.enable_thinking, the key the
/// Qwen3, GLM and DeepSeek templates read) and the thinking budget (thinking_token_budget, which
/// the policy of that name forwards to engines that enforce it and removes for the rest). A
/// budget_tokens that is no positive integer is the client's 400.
std::optional<TranslateError> translate_thinking(const json& thinking, TranslatedRequest& out) {
  const std::string type = str(thinking, "type");
  json& kwargs = out.chat["chat_template_kwargs"];
  if (type == "enabled") {
    kwargs["enable_thinking"] = true;
    if (const json* b = field(thinking, "budget_tokens")) {
      const bool positive = b->is_number_unsigned() ? b->get<uint64_t>() >= 1 && b->get<uint64_t>() <= INT64_MAX
                                                    : b->is_number_integer() && b->get<int64_t>() >= 1;
      if (!positive)
        return TranslateError{"thinking.budget_tokens: expected a positive integer, got " + dump_safe(*b).substr(0, 40)};
      out.chat["thinking_token_budget"] = *b;
    }
  } else if (type == "disabled") {
    kwargs["enable_thinking"] = false;
  } else if (type != "adaptive") {  // adaptive: the model decides, its template's default
    out.warnings.push_back("ignored thinking of type '" + type + "'");
  }
  if (kwargs.empty()) out.chat.erase("chat_template_kwargs");
  return std::nullopt;
}

}  // namespace

bool is_billing_header(const std::string& text) {
  static constexpr std::string_view k_name = "x-anthropic-billing-header:";
  std::size_t i = 0;
  while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
  if (text.size() - i < k_name.size()) return false;
  for (std::size_t k = 0; k < k_name.size(); ++k)
    if (std::tolower(static_cast<unsigned char>(text[i + k])) != k_name[k]) return false;
  return true;
}

std::optional<TranslateError> translate_request(const json& body, const TranslateOptions& opt, TranslatedRequest& out) {
  out = TranslatedRequest{};
  if (!body.is_object()) return TranslateError{"the request body must be a JSON object"};
  const json* model = field(body, "model");
  if (!model || !model->is_string())
    return TranslateError{std::string("model: a string is required, got ") + (model ? model->type_name() : "none")};
  out.chat["model"] = *model;
  const json* msgs = field(body, "messages");
  if (!msgs || !msgs->is_array() || msgs->empty())
    return TranslateError{std::string("messages: a non-empty array is required, got ") +
                          (!msgs ? "none" : msgs->is_array() ? "an empty array" : msgs->type_name())};
  if (auto e = first_mistyped_field(body,
                                    {{"stream", k_json_bool}, {"max_tokens", k_json_integer}, {"system", k_json_string | k_json_array},
                                     {"temperature", k_json_number}, {"top_p", k_json_number}, {"top_k", k_json_integer},
                                     {"tools", k_json_array}, {"tool_choice", k_json_object}, {"stop_sequences", k_json_array},
                                     {"thinking", k_json_object}, {"metadata", k_json_object}, {"output_config", k_json_object}}))
    return TranslateError{e->name + ": expected " + e->expected + ", got " + e->got};
  if (const json* s = field(body, "stream")) out.stream = s->get<bool>();
  if (const json* mt = field(body, "max_tokens")) {
    if (!mt->is_number_integer() || mt->get<int64_t>() < 1)
      return TranslateError{"max_tokens: expected a positive integer, got " + dump_safe(*mt).substr(0, 40)};
    out.chat["max_tokens"] = *mt;
  }

  json messages = json::array();
  std::string system;
  if (const json* s = field(body, "system"))
    if (auto err = system_text(*s, opt, out, system)) return err;
  if (!system.empty()) messages.push_back({{"role", "system"}, {"content", system}});
  for (std::size_t m = 0; m < msgs->size(); ++m) {
    const json& msg = (*msgs)[m];
    const std::string at = "messages." + std::to_string(m);
    if (!msg.is_object())
      return TranslateError{at + ": expected a message object with \"role\" and \"content\", got " + msg.type_name()};
    const json* role_field = field(msg, "role");
    if (!role_field || !role_field->is_string())
      return TranslateError{at + ".role: expected \"user\" or \"assistant\", got " +
                            (role_field ? std::string(role_field->type_name()) : std::string("nothing"))};
    const std::string role = role_field->get<std::string>();
    const json* content = field(msg, "content");
    if (!content || !(content->is_string() || content->is_array()))
      return TranslateError{at + ".content: expected a string or an array of blocks, got " +
                            (content ? std::string(content->type_name()) : std::string("nothing"))};
    std::optional<TranslateError> err;
    if (role == "user") {
      err = user_message(*content, m, opt, out, messages);
    } else if (role == "assistant") {
      err = assistant_message(*content, m, out, messages);
    } else if (role == "system") {
      // Claude Code (2.1) also sends system messages between turns; kept in place.
      std::string text;
      if (auto e = system_text(*content, opt, out, text)) return TranslateError{"messages." + std::to_string(m) + ": " + e->message};
      if (!text.empty()) messages.push_back({{"role", "system"}, {"content", text}});
    } else {
      return TranslateError{at + ".role: expected \"user\" or \"assistant\", got \"" + cut_for_error(role) + "\""};
    }
    if (err) return err;
  }
  if (std::none_of(messages.begin(), messages.end(), [](const json& m) { return m.value("role", "") != "system"; })) {
    std::string why;
    for (const auto& w : out.warnings) why += (why.empty() ? "" : "; ") + w;
    return TranslateError{"messages: no user or assistant content the bridge can translate" + (why.empty() ? std::string() : " (" + why + ")")};
  }
  out.chat["messages"] = std::move(messages);

  if (const json* t = field(body, "tools"); t && t->is_array())
    if (auto err = translate_tools(*t, out)) return err;
  if (const json* tc = field(body, "tool_choice"); tc && tc->is_object()) translate_tool_choice(*tc, out);
  if (const json* th = field(body, "thinking"); th && th->is_object())
    if (auto err = translate_thinking(*th, out)) return err;
  if (const json* oc = field(body, "output_config"); oc && oc->is_object())
    if (const json* e = field(*oc, "effort"); e && e->is_string()) out.chat["reasoning_effort"] = *e;
  for (const char* key : {"temperature", "top_p", "top_k"})
    if (const json* v = field(body, key); v && v->is_number()) out.chat[key] = *v;
  if (const json* ss = field(body, "stop_sequences"); ss && ss->is_array()) {
    json stop = json::array();
    for (const auto& s : *ss)
      if (s.is_string()) {
        stop.push_back(s);
        out.stop_sequences.push_back(s.get<std::string>());
      }
    if (!stop.empty()) out.chat["stop"] = std::move(stop);
  }
  if (out.stream) {
    out.chat["stream"] = true;
    out.chat["stream_options"] = {{"include_usage", true}};
  }
  return std::nullopt;
}

}  // namespace servedeck::gateway::anthropic
