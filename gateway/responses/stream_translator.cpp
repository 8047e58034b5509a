#include "gateway/responses/stream_translator.hpp"


#include "common/finish_reason.hpp"
#include "common/json_limits.hpp"
#include "common/random_id.hpp"
#include "common/stream_limits.hpp"

namespace servedeck::gateway::responses {

using nlohmann::json;

std::string StreamEvent::to_sse() const {
  std::string out = "event: ";
  out += type;
  out += "\ndata: ";
  out += dump_safe(data);
  out += "\n\n";
  return out;
}

StreamTranslator::StreamTranslator(std::string response_id, std::string model, int64_t created_at,
                                   const TranslatedRequest& request)
    : response_id_(std::move(response_id)), model_(std::move(model)), created_at_(created_at), request_(&request) {}

StreamEvent StreamTranslator::make(const std::string& type, json data) {
  data["type"] = type;
  data["sequence_number"] = sequence_++;
  return StreamEvent{type, std::move(data)};
}

json StreamTranslator::usage_json() const {
  if (!usage_.is_object()) return nullptr;
  auto num = [](const json& j, const char* key) -> int64_t {
    return j.contains(key) && j[key].is_number_integer() ? j[key].get<int64_t>() : 0;
  };
  int64_t in = num(usage_, "prompt_tokens");
  int64_t out = num(usage_, "completion_tokens");
  int64_t total = usage_.contains("total_tokens") ? num(usage_, "total_tokens") : in + out;
  int64_t cached = usage_.contains("prompt_tokens_details") && usage_["prompt_tokens_details"].is_object()
                       ? num(usage_["prompt_tokens_details"], "cached_tokens") : 0;
  int64_t reasoning = usage_.contains("completion_tokens_details") && usage_["completion_tokens_details"].is_object()
                          ? num(usage_["completion_tokens_details"], "reasoning_tokens") : 0;
  json u = {{"input_tokens", in},
            {"input_tokens_details", {{"cached_tokens", cached}}},
            {"output_tokens", out},
            {"output_tokens_details", {{"reasoning_tokens", reasoning}}},
            {"total_tokens", total}};
  // A usage the gateway synthesised because the engine reported none (G12,
  // gateway/server/usage_estimate.hpp) keeps its marker; the engine's own usage has neither key.
  for (const char* key : {"servedeck_estimated", "servedeck_usage_source"})
    if (usage_.contains(key)) u[key] = usage_[key];
  return u;
}

json StreamTranslator::item_json(const OpenItem& item, bool done) const {
  const char* status = !done ? "in_progress" : item.truncated ? "incomplete" : "completed";
  switch (item.kind) {
    case ItemKind::reasoning: {
      json content = json::array();
      if (done) content.push_back({{"type", "reasoning_text"}, {"text", item.text}});
      return {{"id", item.id}, {"type", "reasoning"}, {"status", status}, {"summary", json::array()}, {"content", content}};
    }
    case ItemKind::message: {
      json content = json::array();
      if (done) content.push_back({{"type", "output_text"}, {"text", item.text}, {"annotations", json::array()}});
      return {{"id", item.id}, {"type", "message"}, {"status", status}, {"role", "assistant"}, {"content", content}};
    }
    case ItemKind::function_call: {
      json j = {{"id", item.id}, {"type", "function_call"}, {"status", status}, {"call_id", item.call_id},
                {"name", item.name}, {"arguments", done ? item.text : std::string()}};
      if (!item.ns.empty()) j["namespace"] = item.ns;
      return j;
    }
  }
  return json::object();
}

void StreamTranslator::open_item(ItemKind kind, std::vector<StreamEvent>& out) {
  close_current(out);
  OpenItem item{kind, static_cast<int>(items_.size()), "", "", "", "", "", "", false};
  item.id = response_id_ + (kind == ItemKind::reasoning ? "_rs" : "_msg") + std::to_string(item_counter_++);
  items_.push_back(item);
  current_ = static_cast<int>(items_.size()) - 1;
  out.push_back(make("response.output_item.added", {{"output_index", item.output_index}, {"item", item_json(item, false)}}));
  if (kind == ItemKind::message) {
    out.push_back(make("response.content_part.added",
                       {{"item_id", item.id}, {"output_index", item.output_index}, {"content_index", 0},
                        {"part", {{"type", "output_text"}, {"text", ""}, {"annotations", json::array()}}}}));
  }
}

void StreamTranslator::close_current(std::vector<StreamEvent>& out) {
  if (current_ < 0) return;
  const OpenItem& item = items_[static_cast<std::size_t>(current_)];
  current_ = -1;
  json where = {{"item_id", item.id}, {"output_index", item.output_index}, {"content_index", 0}};
  if (item.kind == ItemKind::reasoning) {
    json d = where;
    d["text"] = item.text;
    out.push_back(make("response.reasoning_text.done", d));
  } else {
    json d = where;
    d["text"] = item.text;
    out.push_back(make("response.output_text.done", d));
    json p = where;
    p["part"] = {{"type", "output_text"}, {"text", item.text}, {"annotations", json::array()}};
    out.push_back(make("response.content_part.done", p));
  }
  out.push_back(make("response.output_item.done", {{"output_index", item.output_index}, {"item", item_json(item, true)}}));
}

std::vector<StreamEvent> StreamTranslator::start() {
  std::vector<StreamEvent> out;
  out.push_back(make("response.created", {{"response", response()}}));
  out.push_back(make("response.in_progress", {{"response", response()}}));
  return out;
}

std::vector<StreamEvent> StreamTranslator::on_chunk(const json& chunk) {
  std::vector<StreamEvent> out;
  if (ended_ || !chunk.is_object()) return out;
  if (chunk.contains("usage") && chunk["usage"].is_object()) usage_ = chunk["usage"];
  if (!chunk.contains("choices") || !chunk["choices"].is_array() || chunk["choices"].empty()) return out;
  const json& choice = chunk["choices"][0];
  if (!choice.is_object()) return out;
  const json delta = choice.contains("delta") && choice["delta"].is_object() ? choice["delta"] : json::object();

  std::string reasoning;
  for (const char* key : {"reasoning_content", "reasoning"}) {
    if (delta.contains(key) && delta[key].is_string()) {
      reasoning = delta[key].get<std::string>();
      break;
    }
  }
  // Every byte kept in items_ (for response() and the stored turn) counts against one bound.
  auto within_bound = [&](std::size_t bytes) {
    text_bytes_ += bytes;
    if (text_bytes_ <= k_max_stream_text_bytes) return true;
    for (auto& e : fail("stream_too_large", stream_text_bound_message())) out.push_back(std::move(e));
    return false;
  };
  if (!reasoning.empty()) {
    if (!within_bound(reasoning.size())) return out;
    if (current_ < 0 || items_[static_cast<std::size_t>(current_)].kind != ItemKind::reasoning)
      open_item(ItemKind::reasoning, out);
    OpenItem& item = items_[static_cast<std::size_t>(current_)];
    item.text += reasoning;
    out.push_back(make("response.reasoning_text.delta", {{"item_id", item.id}, {"output_index", item.output_index},
                                                         {"content_index", 0}, {"delta", reasoning}}));
  }
  if (delta.contains("content") && delta["content"].is_string() && !delta["content"].get<std::string>().empty()) {
    const std::string text = delta["content"].get<std::string>();
    if (!within_bound(text.size())) return out;
    if (current_ < 0 || items_[static_cast<std::size_t>(current_)].kind != ItemKind::message)
      open_item(ItemKind::message, out);
    OpenItem& item = items_[static_cast<std::size_t>(current_)];
    item.text += text;
    out.push_back(make("response.output_text.delta", {{"item_id", item.id}, {"output_index", item.output_index},
                                                      {"content_index", 0}, {"delta", text}}));
  }
  if (delta.contains("tool_calls") && delta["tool_calls"].is_array()) {
    for (const auto& tc : delta["tool_calls"]) {
      if (!tc.is_object()) continue;
      const int64_t index = tc.contains("index") && tc["index"].is_number_integer() ? tc["index"].get<int64_t>() : 0;
      const json fn = tc.contains("function") && tc["function"].is_object() ? tc["function"] : json::object();
      auto found = tool_index_.find(index);
      if (found == tool_index_.end()) {
        close_current(out);
        OpenItem item{ItemKind::function_call, static_cast<int>(items_.size()), "", "", "", "", "", "", false};
        item.id = response_id_ + "_fc" + std::to_string(item_counter_++);
        item.call_id = tc.contains("id") && tc["id"].is_string() && !tc["id"].get<std::string>().empty()
                           ? tc["id"].get<std::string>() : "call_" + item.id;
        item.engine_name = fn.contains("name") && fn["name"].is_string() ? fn["name"].get<std::string>() : "";
        auto origin = request_->tool_names.find(item.engine_name);
        if (origin != request_->tool_names.end()) {
          item.name = origin->second.name;
          item.ns = origin->second.ns;
        } else {
          item.name = item.engine_name;
        }
        items_.push_back(item);
        found = tool_index_.emplace(index, static_cast<int>(items_.size()) - 1).first;
        out.push_back(make("response.output_item.added", {{"output_index", item.output_index}, {"item", item_json(item, false)}}));
      }
      OpenItem& item = items_[static_cast<std::size_t>(found->second)];
      if (fn.contains("arguments") && fn["arguments"].is_string() && !fn["arguments"].get<std::string>().empty()) {
        const std::string args = fn["arguments"].get<std::string>();
        if (!within_bound(args.size())) return out;
        item.text += args;
        out.push_back(make("response.function_call_arguments.delta",
                           {{"item_id", item.id}, {"output_index", item.output_index}, {"delta", args}}));
      }
    }
  }
  if (choice.contains("finish_reason") && choice["finish_reason"].is_string())
    finish_reason_ = choice["finish_reason"].get<std::string>();
  return out;
}

std::vector<StreamEvent> StreamTranslator::finish() {
  std::vector<StreamEvent> out;
  if (ended_) return out;
  if (finish_reason_is_failure(finish_reason_)) return fail("engine_aborted", finish_reason_failure_message(finish_reason_));
  // Finish "length" (the token limit) or "content_filter" (the engine's filter) cut the item
  // generated last; its output_item.done (below) and the final response object carry status
  // "incomplete". Items closed earlier were whole.
  const bool cut = finish_reason_ == "length" || finish_reason_ == "content_filter";
  if (cut && !items_.empty()) items_.back().truncated = true;
  close_current(out);
  for (const auto& [index, pos] : tool_index_) {
    (void)index;
    const OpenItem& item = items_[static_cast<std::size_t>(pos)];
    out.push_back(make("response.function_call_arguments.done",
                       {{"item_id", item.id}, {"output_index", item.output_index}, {"arguments", item.text}}));
    out.push_back(make("response.output_item.done", {{"output_index", item.output_index}, {"item", item_json(item, true)}}));
  }
  ended_ = true;
  status_ = cut ? "incomplete" : "completed";
  out.push_back(make(status_ == "incomplete" ? "response.incomplete" : "response.completed", {{"response", response()}}));
  return out;
}

std::vector<StreamEvent> StreamTranslator::fail(const std::string& code, const std::string& message) {
  std::vector<StreamEvent> out;
  if (ended_) return out;
  ended_ = true;
  status_ = "failed";
  error_ = {{"code", code}, {"message", message}};
  out.push_back(make("response.failed", {{"response", response()}}));
  return out;
}

json StreamTranslator::response() const {
  json output = json::array();
  for (std::size_t i = 0; i < items_.size(); ++i) {
    bool open = static_cast<int>(i) == current_ || (!ended_ && items_[i].kind == ItemKind::function_call);
    output.push_back(item_json(items_[i], !open));
  }
  const json& echo = request_->echo;
  auto echoed = [&](const char* key, json fallback) { return echo.contains(key) ? echo[key] : fallback; };
  json r = {{"id", response_id_},
            {"object", "response"},
            {"created_at", created_at_},
            {"status", status_},
            {"model", model_},
            {"output", output},
            {"usage", ended_ ? usage_json() : json(nullptr)},
            {"error", error_.is_null() ? json(nullptr) : error_},
            {"incomplete_details", status_ != "incomplete" ? json(nullptr)
                                  : json{{"reason", finish_reason_ == "content_filter" ? "content_filter" : "max_output_tokens"}}},
            {"instructions", echoed("instructions", nullptr)},
            {"tools", echoed("tools", json::array())},
            {"tool_choice", echoed("tool_choice", "auto")},
            {"temperature", echoed("temperature", nullptr)},
            {"top_p", echoed("top_p", nullptr)},
            {"max_output_tokens", echoed("max_output_tokens", nullptr)},
            {"parallel_tool_calls", echoed("parallel_tool_calls", true)},
            {"previous_response_id", request_->previous_response_id.empty() ? json(nullptr) : json(request_->previous_response_id)},
            {"reasoning", echoed("reasoning", json{{"effort", nullptr}, {"summary", nullptr}})},
            {"store", request_->store},
            {"text", echoed("text", json{{"format", {{"type", "text"}}}})},
            {"truncation", echoed("truncation", "disabled")},
            {"metadata", echoed("metadata", json::object())}};
  return r;
}

json StreamTranslator::assistant_messages() const {
  json msg = {{"role", "assistant"}, {"content", ""}};
  std::string content, reasoning;
  json calls = json::array();
  for (const auto& item : items_) {
    if (item.kind == ItemKind::message) content += item.text;
    if (item.kind == ItemKind::reasoning) reasoning += item.text;
    if (item.kind == ItemKind::function_call) {
      calls.push_back({{"id", item.call_id}, {"type", "function"},
                       {"function", {{"name", item.engine_name}, {"arguments", item.text}}}});
    }
  }
  msg["content"] = content;
  if (!reasoning.empty()) msg["reasoning_content"] = reasoning;
  if (!calls.empty()) msg["tool_calls"] = calls;
  return json::array({msg});
}

json translate_completion(const json& completion, const std::string& response_id, const std::string& model,
                          int64_t created_at, const TranslatedRequest& request) {
  StreamTranslator t(response_id, model, created_at, request);
  (void)t.start();
  json chunk = {{"choices", json::array()}};
  if (completion.contains("usage")) chunk["usage"] = completion["usage"];
  if (completion.contains("choices") && completion["choices"].is_array() && !completion["choices"].empty()) {
    const json& choice = completion["choices"][0];
    json message = choice.contains("message") && choice["message"].is_object() ? choice["message"] : json::object();
    json delta = json::object();
    for (const char* key : {"reasoning_content", "reasoning", "content"}) {
      if (message.contains(key) && message[key].is_string()) delta[key] = message[key];
    }
    if (message.contains("tool_calls") && message["tool_calls"].is_array()) {
      json calls = json::array();
      int i = 0;
      for (auto tc : message["tool_calls"]) {
        if (!tc.is_object()) continue;
        tc["index"] = i++;
        calls.push_back(tc);
      }
      delta["tool_calls"] = calls;
    }
    chunk["choices"].push_back({{"index", 0}, {"delta", delta}, {"finish_reason", choice.value("finish_reason", json(nullptr))}});
  }
  (void)t.on_chunk(chunk);
  (void)t.finish();
  return t.response();
}

}  // namespace servedeck::gateway::responses
