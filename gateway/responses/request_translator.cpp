#include "gateway/responses/request_translator.hpp"

#include <cstdint>
#include <cstdio>

#include "common/json_field_types.hpp"
#include "common/json_limits.hpp"

namespace servedeck::gateway::responses {

using nlohmann::json;

namespace {

// FNV-1a 32-bit: a stable short hash for long flattened names.
uint32_t fnv1a(const std::string& s) {
  uint32_t h = 2166136261u;
  for (unsigned char c : s) {
    h ^= c;
    h *= 16777619u;
  }
  return h;
}

std::string sanitize(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (unsigned char c : s) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
    out.push_back(ok ? static_cast<char>(c) : '_');
  }
  return out;
}

/// A field inside the request (an input item's, a tool's) of a type the Responses API does not
/// allow; translate_request answers it as the 400 "field '<path>' has the wrong type: …".
struct FieldTypeError {
  std::string path;      // "input.3.name"
  std::string expected;  // "a string"
  std::string got;       // json type name
};

/// The string `obj[key]` (at path `at`), or `fallback` when the key is absent or null.
/// Throws FieldTypeError for any other type.
std::string string_at(const json& obj, const char* key, const std::string& at, std::string fallback = "") {
  if (!obj.is_object()) return fallback;
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return fallback;
  if (!it->is_string()) throw FieldTypeError{at + "." + key, "a string", it->type_name()};
  return it->get<std::string>();
}

/// "dropped input.0.content.1 of type 'input_file' (no text the engine can read)".
void drop_part(const json& p, const std::string& at, std::vector<std::string>& warnings) {
  const std::string what = p.is_object() ? "of type '" + string_at(p, "type", at) + "'" : std::string("(a JSON ") + p.type_name() + ")";
  warnings.push_back("dropped " + at + " " + what + " (no text the engine can read)");
}

/// Text of a content value at path `at`: a string, or an array of parts whose text-bearing
/// parts (input_text, output_text, text, refusal) are joined. A part that bears no text (an
/// input_file, an image where none can go, a nested array) is dropped with a warning; a
/// content of another type is a FieldTypeError.
std::string parts_text(const json& content, const std::string& at, std::vector<std::string>& warnings) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) throw FieldTypeError{at, "a string or an array of content parts", content.type_name()};
  std::string out;
  for (std::size_t i = 0; i < content.size(); ++i) {
    const json& p = content[i];
    if (p.is_string()) {
      out += p.get<std::string>();
      continue;
    }
    bool read = false;
    if (p.is_object()) {
      for (const char* key : {"text", "refusal"}) {
        if (auto it = p.find(key); it != p.end() && it->is_string()) {
          out += it->get<std::string>();
          read = true;
          break;
        }
      }
    }
    if (!read) drop_part(p, at + "." + std::to_string(i), warnings);
  }
  return out;
}

/// Chat content for a user or system message: a string when every part is text, else an
/// array of chat parts (text and image_url); other parts dropped with a warning (parts_text).
json chat_content(const json& content, const std::string& at, std::vector<std::string>& warnings) {
  if (content.is_string()) return content;
  if (!content.is_array()) throw FieldTypeError{at, "a string or an array of content parts", content.type_name()};
  bool has_image = false;
  for (std::size_t i = 0; i < content.size(); ++i)
    if (string_at(content[i], "type", at + "." + std::to_string(i)) == "input_image") has_image = true;
  if (!has_image) return parts_text(content, at, warnings);
  json parts = json::array();
  for (std::size_t i = 0; i < content.size(); ++i) {
    const json& p = content[i];
    const std::string pat = at + "." + std::to_string(i);
    std::string type = string_at(p, "type", pat);
    if (type == "input_image") {
      json url = p.contains("image_url") ? p["image_url"] : json(string_at(p, "file_id", pat));
      parts.push_back({{"type", "image_url"}, {"image_url", {{"url", url}}}});
    } else if (p.is_object() && p.contains("text") && p["text"].is_string()) {
      parts.push_back({{"type", "text"}, {"text", p["text"]}});
    } else {
      drop_part(p, pat, warnings);
    }
  }
  return parts;
}

std::string reasoning_text(const json& item) {
  std::string out;
  for (const char* key : {"content", "summary"}) {
    auto it = item.find(key);
    if (it == item.end() || !it->is_array()) continue;
    for (const auto& p : *it) {
      if (p.is_object() && p.contains("text") && p["text"].is_string()) {
        if (!out.empty()) out += "\n";
        out += p["text"].get<std::string>();
      }
    }
    if (!out.empty()) break;  // prefer full reasoning content over the summary
  }
  return out;
}

json function_tool(const json& t, const std::string& flat_name) {
  json fn = {{"name", flat_name}};
  if (t.contains("description") && t["description"].is_string()) fn["description"] = t["description"];
  if (t.contains("parameters") && t["parameters"].is_object()) {
    fn["parameters"] = t["parameters"];
  } else {
    fn["parameters"] = {{"type", "object"}, {"properties", json::object()}};
  }
  if (t.contains("strict") && t["strict"].is_boolean()) fn["strict"] = t["strict"];
  return {{"type", "function"}, {"function", fn}};
}

void translate_tools(const json& tools, TranslatedRequest& out) {
  json chat_tools = json::array();
  for (std::size_t i = 0; i < tools.size(); ++i) {
    const json& t = tools[i];
    const std::string at = "tools." + std::to_string(i);
    if (!t.is_object()) {
      out.warnings.push_back("dropped a tool that is not an object");
      continue;
    }
    std::string type = string_at(t, "type", at);
    if (type == "function" && t.contains("name") && t["name"].is_string()) {
      std::string name = t["name"].get<std::string>();
      std::string flat = flatten_tool_name("", name);
      out.tool_names[flat] = ToolOrigin{"", name};
      chat_tools.push_back(function_tool(t, flat));
    } else if (type == "namespace" && t.contains("tools") && t["tools"].is_array()) {
      std::string ns = string_at(t, "name", at);
      for (const auto& inner : t["tools"]) {
        if (!inner.is_object() || !inner.contains("name") || !inner["name"].is_string()) {
          out.warnings.push_back("dropped a tool without a name in namespace '" + ns + "'");
          continue;
        }
        std::string name = inner["name"].get<std::string>();
        std::string flat = flatten_tool_name(ns, name);
        out.tool_names[flat] = ToolOrigin{ns, name};
        chat_tools.push_back(function_tool(inner, flat));
      }
    } else {
      out.warnings.push_back("dropped tool of type '" + (type.empty() ? std::string("?") : type) +
                             "' (the engine cannot run it)");
    }
  }
  if (!chat_tools.empty()) out.chat["tools"] = std::move(chat_tools);
}

/// The engine-side name of a function the client named `name` (maybe namespaced in `ns`).
std::string engine_name_for(const TranslatedRequest& out, const std::string& ns, const std::string& name) {
  std::string flat = flatten_tool_name(ns, name);
  if (out.tool_names.count(flat)) return flat;
  return ns.empty() ? name : flat;
}

/// Builds the chat messages from `input` items. Returns an error for a wrong `input` type.
std::optional<std::string> translate_input(const json& input, TranslatedRequest& out, json& messages) {
  if (input.is_string()) {
    messages.push_back({{"role", "user"}, {"content", input}});
    return std::nullopt;
  }
  if (!input.is_array()) {
    return "'input' must be a string or an array of items, got " + std::string(input.type_name());
  }
  std::string pending_reasoning;
  std::map<std::string, bool> call_ids;  // call_id → seen as function_call
  // The calls of the turns before this input (a stored turn of previous_response_id): the
  // outputs of those calls are what a tool loop sends next.
  for (const auto& m : messages)
    if (m.is_object() && m.contains("tool_calls") && m["tool_calls"].is_array())
      for (const auto& c : m["tool_calls"])
        if (c.is_object() && c.contains("id") && c["id"].is_string()) call_ids[c["id"].get<std::string>()] = true;
  json* open_assistant = nullptr;        // assistant message collecting tool_calls
  auto attach_reasoning = [&](json& msg) {
    if (!pending_reasoning.empty()) {
      msg["reasoning_content"] = pending_reasoning;
      pending_reasoning.clear();
    }
  };
  for (std::size_t i = 0; i < input.size(); ++i) {
    const json& item = input[i];
    if (!item.is_object()) {
      out.warnings.push_back("dropped input item " + std::to_string(i) + ": not an object");
      continue;
    }
    const std::string at = "input." + std::to_string(i);
    std::string type = string_at(item, "type", at, item.contains("role") ? "message" : "");
    if (type == "message") {
      std::string role = string_at(item, "role", at, "user");
      if (role == "developer") role = "system";
      if (role != "system" && role != "user" && role != "assistant") {
        out.warnings.push_back("dropped input item " + std::to_string(i) + ": unknown role '" + role + "'");
        continue;
      }
      const json content = item.contains("content") && !item["content"].is_null() ? item["content"] : json("");
      json msg = {{"role", role}};
      if (role == "assistant") {
        msg["content"] = parts_text(content, at + ".content", out.warnings);
        attach_reasoning(msg);
        messages.push_back(std::move(msg));
        open_assistant = &messages.back();
      } else {
        msg["content"] = chat_content(content, at + ".content", out.warnings);
        messages.push_back(std::move(msg));
        open_assistant = nullptr;
      }
    } else if (type == "function_call") {
      std::string call_id = string_at(item, "call_id", at, string_at(item, "id", at));
      std::string name = engine_name_for(out, string_at(item, "namespace", at), string_at(item, "name", at));
      json args = item.contains("arguments") ? item["arguments"] : json("{}");
      if (!args.is_string()) args = dump_safe(args);
      if (call_id.empty()) {
        call_id = "call_" + std::to_string(i);
        out.warnings.push_back("function_call item " + std::to_string(i) + " had no call_id; named it " + call_id);
      }
      call_ids[call_id] = true;
      if (open_assistant == nullptr) {
        messages.push_back({{"role", "assistant"}, {"content", ""}});
        open_assistant = &messages.back();
      }
      attach_reasoning(*open_assistant);
      json& calls = (*open_assistant)["tool_calls"];
      if (!calls.is_array()) calls = json::array();
      calls.push_back({{"id", call_id}, {"type", "function"}, {"function", {{"name", name}, {"arguments", args}}}});
    } else if (type == "function_call_output") {
      std::string call_id = string_at(item, "call_id", at);
      if (!call_ids.count(call_id)) {
        out.warnings.push_back("dropped function_call_output for unknown call_id '" + call_id + "'");
        continue;
      }
      const json output = item.contains("output") && !item["output"].is_null() ? item["output"] : json("");
      if (!output.is_string() && !output.is_array())
        throw FieldTypeError{at + ".output", "a string or an array of content parts", output.type_name()};
      std::string text = parts_text(output, at + ".output", out.warnings);
      messages.push_back({{"role", "tool"}, {"tool_call_id", call_id}, {"content", text}});
      open_assistant = nullptr;
    } else if (type == "reasoning") {
      std::string text = reasoning_text(item);
      if (text.empty() && item.contains("encrypted_content"))
        out.warnings.push_back("dropped " + at + " (reasoning): only encrypted_content, which another provider wrote and "
                               "no engine here can read");
      if (!text.empty()) {
        if (!pending_reasoning.empty()) pending_reasoning += "\n";
        pending_reasoning += text;
      }
    } else {
      out.warnings.push_back("dropped input item " + std::to_string(i) + " of type '" + type + "'");
    }
  }
  if (!pending_reasoning.empty()) out.warnings.push_back("dropped reasoning not followed by an assistant turn");
  return std::nullopt;
}

}  // namespace

std::string flatten_tool_name(const std::string& ns, const std::string& name) {
  std::string flat = ns.empty() ? sanitize(name) : sanitize(ns) + "__" + sanitize(name);
  constexpr std::size_t k_max = 64;  // OpenAI function names: ^[a-zA-Z0-9_-]{1,64}$
  if (flat.size() <= k_max) return flat;
  char suffix[10];
  std::snprintf(suffix, sizeof suffix, "_%08x", fnv1a(ns + "\n" + name));
  return flat.substr(0, k_max - 9) + suffix;
}

namespace {
std::optional<std::string> translate_request_unchecked(const json& body, const json* previous_messages,
                                                       TranslatedRequest& out);
}  // namespace

std::optional<std::string> translate_request(const json& body, const json* previous_messages,
                                             TranslatedRequest& out) {
  // note: a field of the wrong type is the client's error, answered as a 400 naming its path
  // (string_at throws FieldTypeError); json::exception stays caught for any other access.
  try {
    return translate_request_unchecked(body, previous_messages, out);
  } catch (const FieldTypeError& e) {
    return "field '" + e.path + "' has the wrong type: expected " + e.expected + ", got " + e.got;
  } catch (const json::exception& e) {
    std::string what = e.what();
    if (auto p = what.find("] "); p != std::string::npos) what = what.substr(p + 2);
    return "a field of the Responses request has the wrong type (" + what +
           "); see the Responses API reference for each field's type";
  }
}

namespace {

/// The first top-level field of `body` whose type the Responses API does not allow, named with
/// what was read and what was expected ("field 'max_output_tokens' has the wrong type: expected an
/// integer, got string"); null fields count as absent. Also max_output_tokens >= 1.
std::optional<std::string> check_field_types(const json& body) {
  if (auto e = first_mistyped_field(
          body, {{"model", k_json_string},          {"stream", k_json_bool},          {"store", k_json_bool},
                 {"previous_response_id", k_json_string}, {"instructions", k_json_string}, {"input", k_json_string | k_json_array},
                 {"max_output_tokens", k_json_integer}, {"temperature", k_json_number}, {"top_p", k_json_number},
                 {"parallel_tool_calls", k_json_bool}, {"user", k_json_string},         {"seed", k_json_integer},
                 {"tools", k_json_array},          {"tool_choice", k_json_string | k_json_object}, {"reasoning", k_json_object},
                 {"text", k_json_object},          {"metadata", k_json_object},      {"truncation", k_json_string}}))
    return "field '" + e->name + "' has the wrong type: expected " + e->expected + ", got " + e->got;
  if (body.contains("max_output_tokens") && body["max_output_tokens"].is_number_integer() &&
      !(body["max_output_tokens"].is_number_unsigned() && body["max_output_tokens"].get<std::uint64_t>() >= 1))
    return "field 'max_output_tokens' must be a positive integer, got " + dump_safe(body["max_output_tokens"]);
  return std::nullopt;
}

std::optional<std::string> translate_request_unchecked(const json& body, const json* previous_messages,
                                                       TranslatedRequest& out) {
  if (!body.is_object()) return "request body must be a JSON object";
  if (!body.contains("model") || !body["model"].is_string()) return "'model' (string) is required";
  if (auto err = check_field_types(body)) return err;
  out = TranslatedRequest{};
  out.chat["model"] = body["model"];
  // check_field_types let these through as their type or null; null is the default.
  auto given = [&](const char* key) { return body.contains(key) && !body[key].is_null(); };
  out.stream = given("stream") ? body["stream"].get<bool>() : false;
  out.store = given("store") ? body["store"].get<bool>() : true;
  out.previous_response_id = given("previous_response_id") ? body["previous_response_id"].get<std::string>() : "";

  if (body.contains("tools") && body["tools"].is_array()) translate_tools(body["tools"], out);

  json messages = json::array();
  if (previous_messages && previous_messages->is_array()) {
    for (const auto& m : *previous_messages) messages.push_back(m);
  }
  if (body.contains("instructions") && body["instructions"].is_string() &&
      !body["instructions"].get<std::string>().empty()) {
    // Instructions of this request replace any earlier system message (Responses semantics:
    // instructions do not carry over through previous_response_id).
    json kept = json::array();
    for (auto& m : messages)
      if (m.value("role", "") != "system") kept.push_back(std::move(m));
    messages = json::array({{{"role", "system"}, {"content", body["instructions"]}}});
    for (auto& m : kept) messages.push_back(std::move(m));
  }
  if (body.contains("input")) {
    if (auto err = translate_input(body["input"], out, messages)) return err;
  }
  if (messages.empty()) {
    if (!body.contains("input")) return "'input' is required";
    std::string why;
    for (const auto& w : out.warnings) why += (why.empty() ? "" : "; ") + w;
    return "'input' has no item the bridge can translate" + (why.empty() ? std::string(" (it is empty)") : ": " + why);
  }
  out.chat["messages"] = std::move(messages);

  if (body.contains("max_output_tokens") && body["max_output_tokens"].is_number_integer())
    out.chat["max_tokens"] = body["max_output_tokens"];
  for (const char* key : {"temperature", "top_p", "parallel_tool_calls", "user", "seed"}) {
    if (body.contains(key) && !body[key].is_null()) out.chat[key] = body[key];
  }
  if (body.contains("reasoning") && body["reasoning"].is_object() && body["reasoning"].contains("effort") &&
      body["reasoning"]["effort"].is_string()) {
    out.chat["reasoning_effort"] = body["reasoning"]["effort"];
  }
  if (body.contains("tool_choice")) {
    const json& tc = body["tool_choice"];
    if (tc.is_string()) {
      out.chat["tool_choice"] = tc;
    } else if (tc.is_object() && string_at(tc, "type", "tool_choice") == "function" && tc.contains("name")) {
      std::string name = engine_name_for(out, string_at(tc, "namespace", "tool_choice"), string_at(tc, "name", "tool_choice"));
      out.chat["tool_choice"] = {{"type", "function"}, {"function", {{"name", name}}}};
    } else {
      out.warnings.push_back("ignored tool_choice of an unsupported shape");
    }
  }
  if (body.contains("text") && body["text"].is_object() && body["text"].contains("format")) {
    const json& f = body["text"]["format"];
    const std::string ftype = string_at(f, "type", "text.format");
    if (ftype == "json_schema") {
      json schema = {{"name", string_at(f, "name", "text.format", "response")}, {"schema", f.value("schema", json::object())}};
      if (f.contains("strict")) schema["strict"] = f["strict"];
      out.chat["response_format"] = {{"type", "json_schema"}, {"json_schema", schema}};
    } else if (ftype == "json_object") {
      out.chat["response_format"] = {{"type", "json_object"}};
    }
  }
  if (out.stream) {
    out.chat["stream"] = true;
    out.chat["stream_options"] = {{"include_usage", true}};
  }
  for (const char* key : {"instructions", "tools", "tool_choice", "temperature", "top_p", "max_output_tokens",
                          "parallel_tool_calls", "reasoning", "metadata", "text", "truncation", "user"}) {
    if (body.contains(key)) out.echo[key] = body[key];
  }
  return std::nullopt;
}

}  // namespace

}  // namespace servedeck::gateway::responses
