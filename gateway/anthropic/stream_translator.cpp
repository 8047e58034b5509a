#include "gateway/anthropic/stream_translator.hpp"

#include <algorithm>
#include <cstdio>
#include <optional>
#include <string_view>

#include "common/finish_reason.hpp"
#include "common/json_limits.hpp"
#include "common/random_id.hpp"
#include "common/stream_limits.hpp"

namespace servedeck::gateway::anthropic {

using nlohmann::json;

namespace {

int64_t int_field(const json& j, const char* key) {
  if (!j.is_object()) return 0;
  auto it = j.find(key);
  return it != j.end() && it->is_number_integer() ? it->get<int64_t>() : 0;
}

std::string string_field(const json& j, const char* key) {
  if (!j.is_object()) return {};
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
}

bool is_blank(std::string_view text) {
  return text.find_first_not_of(" \t\r\n") == std::string_view::npos;
}

}  // namespace

std::string StreamEvent::to_sse() const { return "event: " + type + "\ndata: " + dump_safe(data) + "\n\n"; }

std::string thinking_signature(const std::string& thinking) {
  uint64_t h = 14695981039346656037ull;  // FNV-1a 64-bit offset basis
  for (unsigned char c : thinking) {
    h ^= c;
    h *= 1099511628211ull;  // FNV prime
  }
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
  return std::string("servedeck-v1.") + hex;
}

std::string error_type_for_status(int status) {
  switch (status) {
    case 400: return "invalid_request_error";
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 413: return "request_too_large";
    case 429: return "rate_limit_error";
    case 503:
    case 529: return "overloaded_error";
    default: return status >= 400 && status < 500 ? "invalid_request_error" : "api_error";
  }
}

json error_body(const std::string& type, const std::string& message) {
  return {{"type", "error"}, {"error", {{"type", type}, {"message", message}}}};
}

std::optional<std::string> tool_input_error(const std::string& name, const std::string& id, const std::string& arguments) {
  if (arguments.empty()) return std::nullopt;  // a call without arguments: input {}
  JsonError err;
  const json input = parse_untrusted(arguments, &err);
  if (input.is_object()) return std::nullopt;
  const std::string why = input.is_discarded() ? err.message : std::string("a JSON ") + input.type_name() + ", not an object";
  constexpr std::size_t k_excerpt = 200;
  return "servedeck: the engine's arguments for tool call '" + name + "' (" + id + ") cannot be a tool_use input: " +
         why + " (" + std::to_string(arguments.size()) + " bytes, beginning " + arguments.substr(0, k_excerpt) +
         (arguments.size() > k_excerpt ? "…" : "") + ")";
}

StreamTranslator::StreamTranslator(std::string message_id, std::string model, const TranslatedRequest& request)
    : id_(std::move(message_id)), model_(std::move(model)), request_(&request) {}

StreamEvent StreamTranslator::make(const std::string& type, json data) const {
  data["type"] = type;
  return StreamEvent{type, std::move(data)};
}

json StreamTranslator::usage_json() const {
  // note: an engine's negative count reads as 0 (and keeps std::clamp's bounds ordered).
  const int64_t prompt = std::max<int64_t>(int_field(usage_, "prompt_tokens"), 0);
  int64_t cached = 0;
  if (usage_.is_object() && usage_.contains("prompt_tokens_details"))
    cached = std::clamp<int64_t>(int_field(usage_["prompt_tokens_details"], "cached_tokens"), 0, prompt);
  // Anthropic counts cache reads apart from input_tokens (total input = input + cache reads).
  json u = {{"input_tokens", prompt - cached},
            {"output_tokens", std::max<int64_t>(int_field(usage_, "completion_tokens"), 0)},
            {"cache_creation_input_tokens", 0},
            {"cache_read_input_tokens", cached}};
  // A usage the gateway synthesised because the engine reported none keeps its marker (G12).
  for (const char* key : {"servedeck_estimated", "servedeck_usage_source"})
    if (usage_.is_object() && usage_.contains(key)) u[key] = usage_[key];
  return u;
}

std::string StreamTranslator::stop_reason() const {
  if (finish_reason_ == "length") return "max_tokens";
  if (finish_reason_ == "content_filter") return "refusal";
  if (finish_reason_ == "tool_calls" || !tool_blocks_.empty()) return "tool_use";
  if (!stop_string_.empty() &&
      std::find(request_->stop_sequences.begin(), request_->stop_sequences.end(), stop_string_) !=
          request_->stop_sequences.end())
    return "stop_sequence";
  return "end_turn";
}

json StreamTranslator::block_json(const Block& b) const {
  switch (b.kind) {
    case Kind::thinking:
      return {{"type", "thinking"}, {"thinking", b.text}, {"signature", thinking_signature(b.text)}};
    case Kind::text:
      return {{"type", "text"}, {"text", b.text}};
    case Kind::tool_use: {
      // Only a block whose arguments are a JSON object gets here (tool_input_error).
      json input = b.text.empty() ? json::object() : parse_untrusted(b.text);
      if (!input.is_object()) input = json::object();
      return {{"type", "tool_use"}, {"id", b.id}, {"name", b.name}, {"input", std::move(input)}};
    }
  }
  return json::object();
}

std::vector<StreamEvent> StreamTranslator::start() {
  std::vector<StreamEvent> out;
  if (started_) return out;
  started_ = true;
  json msg = {{"id", id_}, {"type", "message"}, {"role", "assistant"}, {"model", model_},
              {"content", json::array()}, {"stop_reason", nullptr}, {"stop_sequence", nullptr},
              // note: engines report usage only at the end; the real counts come in message_delta.
              {"usage", {{"input_tokens", 0}, {"output_tokens", 0}, {"cache_creation_input_tokens", 0},
                         {"cache_read_input_tokens", 0}}}};
  out.push_back(make("message_start", {{"message", std::move(msg)}}));
  return out;
}

std::vector<StreamEvent> StreamTranslator::ping() {
  if (!started_ || ended_) return {};
  return {make("ping", json::object())};
}

void StreamTranslator::open(Block block, std::vector<StreamEvent>& out) {
  close_open(out);
  if (ended_) return;
  blocks_.push_back(std::move(block));
  open_ = static_cast<int>(blocks_.size()) - 1;
  const Block& b = blocks_.back();
  json start;
  switch (b.kind) {
    case Kind::thinking: start = {{"type", "thinking"}, {"thinking", ""}, {"signature", ""}}; break;
    case Kind::text: start = {{"type", "text"}, {"text", ""}}; break;
    case Kind::tool_use: start = {{"type", "tool_use"}, {"id", b.id}, {"name", b.name}, {"input", json::object()}}; break;
  }
  out.push_back(make("content_block_start", {{"index", open_}, {"content_block", std::move(start)}}));
}

void StreamTranslator::close_open(std::vector<StreamEvent>& out) {
  if (open_ < 0) return;
  const Block& b = blocks_[static_cast<std::size_t>(open_)];
  if (b.kind == Kind::tool_use) {
    // The client parses the block's partial_json into `input` at content_block_stop: arguments
    // that are no JSON object would look like a call they are not.
    if (auto why = tool_input_error(b.name, b.id, b.text)) {
      open_ = -1;
      for (auto& e : fail("api_error", *why)) out.push_back(std::move(e));
      return;
    }
  }
  if (b.kind == Kind::thinking)
    out.push_back(make("content_block_delta", {{"index", open_},
                                               {"delta", {{"type", "signature_delta"}, {"signature", thinking_signature(b.text)}}}}));
  out.push_back(make("content_block_stop", {{"index", open_}}));
  open_ = -1;
  held_blank_.clear();
}

bool StreamTranslator::within_bound(std::size_t bytes, std::vector<StreamEvent>& out) {
  text_bytes_ += bytes;
  if (text_bytes_ <= k_max_stream_text_bytes) return true;
  for (auto& e : fail("api_error", "servedeck: " + stream_text_bound_message())) out.push_back(std::move(e));
  return false;
}

void StreamTranslator::append(Kind kind, const std::string& fragment, std::vector<StreamEvent>& out) {
  if (fragment.empty() || !within_bound(fragment.size(), out)) return;
  std::string text = fragment;
  if (kind == Kind::text && open_ >= 0 && blocks_[static_cast<std::size_t>(open_)].kind == Kind::tool_use) {
    // Engines send the whitespace between tool-call markup as content, even between two
    // argument fragments of one call: it is held (the call stays open), and goes before the
    // next text that is more than whitespace.
    if (is_blank(text)) {
      held_blank_ += text;
      return;
    }
    text = held_blank_ + text;
  }
  if (open_ < 0 || blocks_[static_cast<std::size_t>(open_)].kind != kind) open(Block{kind, "", "", ""}, out);
  if (ended_) return;
  blocks_[static_cast<std::size_t>(open_)].text += text;
  json delta = kind == Kind::thinking ? json{{"type", "thinking_delta"}, {"thinking", text}}
                                      : json{{"type", "text_delta"}, {"text", text}};
  out.push_back(make("content_block_delta", {{"index", open_}, {"delta", std::move(delta)}}));
}

std::vector<StreamEvent> StreamTranslator::on_chunk(const json& chunk) {
  std::vector<StreamEvent> out = start();
  if (ended_ || !chunk.is_object()) return out;
  if (auto u = chunk.find("usage"); u != chunk.end() && u->is_object()) usage_ = *u;
  auto choices = chunk.find("choices");
  if (choices == chunk.end() || !choices->is_array() || choices->empty() || !(*choices)[0].is_object()) return out;
  const json& choice = (*choices)[0];
  const json delta = choice.contains("delta") && choice["delta"].is_object() ? choice["delta"] : json::object();

  std::string reasoning = string_field(delta, "reasoning_content");
  if (reasoning.empty()) reasoning = string_field(delta, "reasoning");
  append(Kind::thinking, reasoning, out);
  if (ended_) return out;
  append(Kind::text, string_field(delta, "content"), out);
  if (ended_) return out;
  if (auto calls = delta.find("tool_calls"); calls != delta.end() && calls->is_array()) {
    for (const auto& tc : *calls) {
      if (!tc.is_object()) continue;
      const int64_t index = int_field(tc, "index");
      const json fn = tc.contains("function") && tc["function"].is_object() ? tc["function"] : json::object();
      auto found = tool_blocks_.find(index);
      if (found == tool_blocks_.end()) {
        std::string id = string_field(tc, "id");
        if (id.empty()) id = random_id("toolu");
        open(Block{Kind::tool_use, "", id, string_field(fn, "name")}, out);
        if (ended_) return out;
        found = tool_blocks_.emplace(index, open_).first;
      }
      // Arguments only ever go into their own block while it is open (engines stream one call
      // after another). A fragment for a call whose block is closed (text or another call came
      // between) cannot be delivered — a block is never reopened — and is never dropped: the
      // stream fails naming it.
      const std::string args = string_field(fn, "arguments");
      if (args.empty()) continue;
      if (found->second != open_) {
        const Block& closed = blocks_[static_cast<std::size_t>(found->second)];
        for (auto& e : fail("api_error", "servedeck: the engine sent more arguments for tool call '" + closed.name + "' (" +
                                             closed.id + ", content block " + std::to_string(found->second) +
                                             ") after the block was closed by later output; a Messages stream cannot "
                                             "reopen a block, and the call without them would be wrong"))
          out.push_back(std::move(e));
        return out;
      }
      if (!within_bound(args.size(), out)) return out;
      blocks_[static_cast<std::size_t>(open_)].text += args;
      out.push_back(make("content_block_delta", {{"index", open_},
                                                 {"delta", {{"type", "input_json_delta"}, {"partial_json", args}}}}));
    }
  }
  if (auto f = choice.find("finish_reason"); f != choice.end() && f->is_string()) finish_reason_ = f->get<std::string>();
  if (auto s = choice.find("stop_reason"); s != choice.end() && s->is_string()) stop_string_ = s->get<std::string>();
  return out;
}

std::vector<StreamEvent> StreamTranslator::finish() {
  std::vector<StreamEvent> out = start();
  if (ended_) return out;
  if (finish_reason_is_failure(finish_reason_)) {
    for (auto& e : fail("api_error", "servedeck: " + finish_reason_failure_message(finish_reason_))) out.push_back(std::move(e));
    return out;
  }
  close_open(out);
  if (ended_) return out;
  ended_ = true;
  const std::string reason = stop_reason();
  out.push_back(make("message_delta",
                     {{"delta", {{"stop_reason", reason},
                                 {"stop_sequence", reason == "stop_sequence" ? json(stop_string_) : json(nullptr)}}},
                      {"usage", usage_json()}}));
  out.push_back(make("message_stop", json::object()));
  return out;
}

std::vector<StreamEvent> StreamTranslator::fail(const std::string& type, const std::string& message) {
  std::vector<StreamEvent> out = start();
  if (ended_) return out;
  ended_ = true;
  failed_ = true;
  out.push_back(make("error", {{"error", {{"type", type}, {"message", message}}}}));
  return out;
}

json StreamTranslator::message() const {
  json content = json::array();
  for (const auto& b : blocks_) content.push_back(block_json(b));
  const std::string reason = ended_ && !failed_ ? stop_reason() : std::string();
  return {{"id", id_},
          {"type", "message"},
          {"role", "assistant"},
          {"model", model_},
          {"content", std::move(content)},
          {"stop_reason", reason.empty() ? json(nullptr) : json(reason)},
          {"stop_sequence", reason == "stop_sequence" ? json(stop_string_) : json(nullptr)},
          {"usage", usage_json()}};
}

json translate_completion(const json& completion, const std::string& message_id, const std::string& model,
                          const TranslatedRequest& request, std::string* error) {
  StreamTranslator t(message_id, model, request);
  json chunk = {{"choices", json::array()}};
  if (completion.is_object() && completion.contains("usage")) chunk["usage"] = completion["usage"];
  if (completion.is_object() && completion.contains("choices") && completion["choices"].is_array() &&
      !completion["choices"].empty() && completion["choices"][0].is_object()) {
    const json& choice = completion["choices"][0];
    const json message = choice.contains("message") && choice["message"].is_object() ? choice["message"] : json::object();
    json delta = json::object();
    for (const char* key : {"reasoning_content", "reasoning", "content"})
      if (message.contains(key) && message[key].is_string()) delta[key] = message[key];
    if (message.contains("tool_calls") && message["tool_calls"].is_array()) {
      json calls = json::array();
      int64_t i = 0;
      for (auto tc : message["tool_calls"]) {
        if (!tc.is_object()) continue;
        tc["index"] = i++;
        calls.push_back(std::move(tc));
      }
      delta["tool_calls"] = std::move(calls);
    }
    json c = {{"index", 0}, {"delta", std::move(delta)}};
    for (const char* key : {"finish_reason", "stop_reason"})
      if (choice.contains(key)) c[key] = choice[key];
    chunk["choices"].push_back(std::move(c));
  }
  std::vector<StreamEvent> events = t.on_chunk(chunk);
  for (auto& e : t.finish()) events.push_back(std::move(e));
  if (t.failed()) {
    for (const auto& e : events)
      if (e.type == "error" && error) *error = string_field(e.data["error"], "message");
    return nullptr;
  }
  return t.message();
}

}  // namespace servedeck::gateway::anthropic
