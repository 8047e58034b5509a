#include "common/json_limits.hpp"

namespace servedeck {

using nlohmann::json;

std::optional<std::string> check_json_nesting(std::string_view text, std::size_t max_depth) {
  std::size_t depth = 0;
  bool in_string = false, escaped = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth)
        return "JSON nested deeper than " + std::to_string(max_depth) + " levels (at byte " + std::to_string(i) + ")";
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return std::nullopt;
}

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
  bool parse_error(std::size_t position, const std::string& /*last_token*/, const nlohmann::detail::exception& ex) {
    failed = true;
    position_ = position;
    what_ = ex.what();
    return false;
  }

  bool failed = false;
  std::size_t position_ = 0;
  std::string what_;

 private:
  nlohmann::detail::json_sax_dom_parser<json> dom_;
};

json refuse(JsonError* error, std::size_t byte, std::string message) {
  if (error) {
    error->byte = byte;
    error->message = std::move(message);
  }
  return json(json::value_t::discarded);
}

}  // namespace

json parse_untrusted(std::string_view text, JsonError* error, JsonLimits limits) {
  if (text.size() > limits.max_bytes)
    return refuse(error, 0,
                  "JSON text of " + std::to_string(text.size()) + " bytes exceeds the limit of " +
                      std::to_string(limits.max_bytes) + " bytes");
  if (auto deep = check_json_nesting(text, limits.max_depth)) return refuse(error, 0, *deep);
  json result;
  OffsetSax sax(result);
  bool ok = false;
  try {
    ok = json::sax_parse(text.begin(), text.end(), &sax, json::input_format_t::json, true);
  } catch (const std::exception& e) {  // note: the DOM builder can throw on allocation failure
    return refuse(error, 0, std::string("JSON could not be parsed: ") + e.what());
  }
  if (ok && !sax.failed) return result;
  // nlohmann's position counts characters read including the failing one (1-based); report a
  // 0-based byte offset of that byte.
  std::size_t byte = sax.position_ > 0 ? sax.position_ - 1 : 0;
  if (byte > text.size()) byte = text.size();
  std::string reason = sax.what_;
  // Drop nlohmann's "[json.exception.parse_error.101] parse error at line 1, column 5: " prefix.
  if (auto p = reason.find(": "); p != std::string::npos && reason.rfind("[json.exception", 0) == 0)
    reason = reason.substr(p + 2);
  return refuse(error, byte, "malformed JSON at byte " + std::to_string(byte) + ": " + reason);
}

std::string dump_safe(const json& j, int indent) {
  return j.dump(indent, ' ', false, json::error_handler_t::replace);
}

}  // namespace servedeck
