#include "gateway/server/request_body.hpp"

#include "common/json_limits.hpp"

#include <vector>

namespace servedeck::gateway {

using nlohmann::json;

namespace {

/// A SAX handler that builds the DOM through nlohmann's own builder and records, instead of
/// throwing, where a syntax error happened.
class OffsetSax {
 public:
  explicit OffsetSax(json& result) : dom_(result, false) {}

  bool null() { return dom_.null(); }
  bool boolean(bool v) { return dom_.boolean(v); }
  bool number_integer(json::number_integer_t v) { return dom_.number_integer(v); }
  bool number_unsigned(json::number_unsigned_t v) { return dom_.number_unsigned(v); }
  bool number_float(json::number_float_t v, const std::string& s) { return dom_.number_float(v, s); }
  bool string(std::string& v) { return dom_.string(v); }
  bool binary(json::binary_t& v) { return dom_.binary(v); }
  bool start_object(std::size_t n) { return dom_.start_object(n); }
  bool key(std::string& k) { return dom_.key(k); }
  bool end_object() { return dom_.end_object(); }
  bool start_array(std::size_t n) { return dom_.start_array(n); }
  bool end_array() { return dom_.end_array(); }
  bool parse_error(std::size_t position, const std::string& last_token, const nlohmann::detail::exception& ex) {
    failed = true;
    position_ = position;
    last_token_ = last_token;
    what_ = ex.what();
    return false;
  }

  bool failed = false;
  std::size_t position_ = 0;
  std::string last_token_;
  std::string what_;

 private:
  nlohmann::detail::json_sax_dom_parser<json> dom_;
};

bool is_empty_value(const json& v) {
  if (v.is_null()) return true;
  if (v.is_string()) return v.get_ref<const std::string&>().empty();
  if (v.is_array() || v.is_object()) return v.empty();
  return false;
}

}  // namespace

json parse_json(std::string_view text, JsonParseError& error) {
  if (auto deep = check_json_nesting(text)) {
    error.byte = 0;
    error.message = *deep;
    return json(json::value_t::discarded);
  }
  json result;
  OffsetSax sax(result);
  bool ok = json::sax_parse(text.begin(), text.end(), &sax, json::input_format_t::json, true);
  if (ok && !sax.failed) return result;
  // nlohmann's position counts characters read including the failing one (1-based); report a
  // 0-based byte offset of that byte.
  error.byte = sax.position_ > 0 ? sax.position_ - 1 : 0;
  if (error.byte > text.size()) error.byte = text.size();
  std::string reason = sax.what_;
  // Drop nlohmann's "[json.exception.parse_error.101] parse error at line 1, column 5: " prefix.
  if (auto p = reason.find(": "); p != std::string::npos && reason.rfind("[json.exception", 0) == 0)
    reason = reason.substr(p + 2);
  error.message = "malformed JSON at byte " + std::to_string(error.byte) + ": " + reason;
  return json(json::value_t::discarded);
}

int clean_chat_request(json& body) {
  if (!body.is_object()) return 0;
  int repairs = 0;
  if (auto m = body.find("messages"); m != body.end() && m->is_array()) {
    for (auto& msg : *m) {
      if (!msg.is_object()) continue;
      std::vector<std::string> drop;
      for (const auto& [k, v] : msg.items()) {
        if ((k == "refusal" || k == "audio" || k == "function_call" || k == "tool_calls" || k == "name") &&
            is_empty_value(v))
          drop.push_back(k);
      }
      for (const auto& k : drop) msg.erase(k);
      repairs += static_cast<int>(drop.size());
    }
  }
  if (auto t = body.find("tools"); t != body.end() && t->is_array()) {
    for (auto& tool : *t) {
      if (!tool.is_object()) continue;
      auto fn = tool.find("function");
      if (fn == tool.end() || !fn->is_object()) continue;
      json clean_fn = json::object();
      for (const char* k : {"name", "description", "parameters", "strict"}) {
        if (auto it = fn->find(k); it != fn->end() && !it->is_null()) clean_fn[k] = *it;
      }
      if (!clean_fn.contains("parameters") || !clean_fn["parameters"].is_object()) {
        clean_fn["parameters"] = json{{"type", "object"}, {"properties", json::object()}};
        ++repairs;
      }
      json clean_tool = json::object();
      clean_tool["type"] = "function";
      clean_tool["function"] = std::move(clean_fn);
      if (clean_tool.size() != tool.size() || (*fn).size() != clean_tool["function"].size()) ++repairs;
      tool = std::move(clean_tool);
    }
  }
  return repairs;
}

}  // namespace servedeck::gateway
