#include "worker/parsers/qwen3_coder_parser.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <string>

#include "common/json_limits.hpp"
#include "worker/parsers/tool_call_block.hpp"

namespace servedeck::worker {

namespace {

using detail::dump;
using detail::k_close;
using detail::trim;

constexpr std::string_view k_function_open = "<function=";
constexpr std::string_view k_function_close = "</function>";
constexpr std::string_view k_parameter_open = "<parameter=";
constexpr std::string_view k_parameter_close = "</parameter>";
// note: a function name or parameter key longer than this is not markup the template asks for;
// bounding the search for its closing '>' keeps a hostile stream linear.
constexpr std::size_t k_max_name_bytes = 256;
constexpr std::size_t k_longest_tag = k_parameter_close.size();

std::string lower(std::string_view s) {
  std::string out(s);
  for (auto& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

bool starts_with(std::string_view s, std::string_view prefix) { return s.substr(0, prefix.size()) == prefix; }

/// The schema's declared type of `function`'s parameter `key`, lower-cased; "" when none.
std::string declared_type(const nlohmann::json& tools, std::string_view function, std::string_view key) {
  if (!tools.is_array()) return {};
  for (const auto& t : tools) {
    if (!t.is_object()) continue;
    const auto f = t.find("function");
    if (f == t.end() || !f->is_object()) continue;
    const auto n = f->find("name");
    if (n == f->end() || !n->is_string() || n->get_ref<const std::string&>() != function) continue;
    const auto params = f->find("parameters");
    if (params == f->end() || !params->is_object()) return {};
    const auto props = params->find("properties");
    if (props == params->end() || !props->is_object()) return {};
    const auto prop = props->find(std::string(key));
    if (prop == props->end() || !prop->is_object()) return {};
    const auto type = prop->find("type");
    if (type == prop->end()) return {};
    if (type->is_string()) return lower(trim(type->get_ref<const std::string&>()));
    if (type->is_array())
      for (const auto& e : *type)
        if (e.is_string() && lower(e.get_ref<const std::string&>()) != "null") return lower(trim(e.get_ref<const std::string&>()));
    return {};
  }
  return {};
}

nlohmann::json integer_or_text(std::string_view text) {
  const std::string_view t = trim(text);
  std::string_view digits = t;
  if (!digits.empty() && digits[0] == '+') digits.remove_prefix(1);
  std::int64_t v = 0;
  const auto r = std::from_chars(digits.data(), digits.data() + digits.size(), v);
  if (!digits.empty() && r.ec == std::errc() && r.ptr == digits.data() + digits.size()) return v;
  return std::string(text);
}

nlohmann::json number_or_text(std::string_view text) {
  const std::string t(trim(text));
  if (t.empty()) return std::string(text);
  char* end = nullptr;
  const double v = std::strtod(t.c_str(), &end);
  if (end != t.c_str() + t.size() || !std::isfinite(v)) return std::string(text);
  // vLLM's reading: a float with no fractional part is an integer (3.0 -> 3).
  if (v == std::floor(v) && std::fabs(v) < 9007199254740992.0) return static_cast<std::int64_t>(v);
  return v;
}

// The body of one <tool_call> block: <function=NAME> then <parameter=KEY>VALUE</parameter>…
class Qwen3CoderParser final : public detail::BlockParser {
 public:
  Qwen3CoderParser(const nlohmann::json& tools, ToolCallIdGenerator ids) : BlockParser(std::move(ids)), tools_(tools) {}

 protected:
  void begin_block() override {
    index_ = -1;
    n_args_ = 0;
    scan_ = 0;
    failed_ = false;
  }

  bool on_body(std::vector<ParseDelta>& out, bool at_end) override {
    if (failed_) return fail(out, at_end);
    for (;;) {
      const std::size_t skip = std::min(buf_.size(), buf_.find_first_not_of(" \t\r\n"));
      const std::string_view rest = std::string_view(buf_).substr(skip);
      if (index_ < 0) {
        // Expect <function=NAME>.
        if (!starts_with(rest, k_function_open)) {
          if (!at_end && starts_with(k_function_open, rest)) return false;
          return fail(out, at_end);
        }
        const std::size_t name_at = skip + k_function_open.size();
        const std::size_t gt = buf_.find('>', name_at);
        if (gt == std::string::npos || gt - name_at > k_max_name_bytes) {
          if (!at_end && buf_.size() - name_at <= k_max_name_bytes) return false;
          return fail(out, at_end);
        }
        const std::string name(trim(std::string_view(buf_).substr(name_at, gt - name_at)));
        if (name.empty() || name.find_first_of("<>{}\" \t\r\n") != std::string::npos) return fail(out, at_end);
        buf_.erase(0, gt + 1);
        scan_ = 0;
        index_ = start_call(out, name);
        name_ = name;
        continue;
      }
      if (starts_with(rest, k_close)) {
        close_arguments(out);
        buf_.erase(0, skip + k_close.size());
        return true;
      }
      if (starts_with(rest, k_function_close)) {
        buf_.erase(0, skip + k_function_close.size());
        scan_ = 0;
        continue;
      }
      if (starts_with(rest, k_function_open)) {  // a second call inside the same block
        close_arguments(out);
        buf_.erase(0, skip);
        begin_block();
        continue;
      }
      if (starts_with(rest, k_parameter_open)) {
        const int r = parameter(out, skip, at_end);
        if (r < 0) return false;  // needs more text
        if (r > 0) return true;   // the block ended inside the value (end of output)
        continue;
      }
      // Neither tag (yet): wait while what we have may still become one, else skip to the next.
      if (!at_end) {
        for (auto tag : {k_close, k_function_close, k_parameter_open, k_function_open})
          if (starts_with(tag, rest)) return false;
      }
      std::size_t next = std::string::npos;
      for (auto tag : {k_close, k_function_close, k_parameter_open, k_function_open})
        next = std::min(next, buf_.find(tag, skip + 1));
      if (next == std::string::npos) {
        if (at_end) {
          close_arguments(out);
          buf_.clear();
          return true;
        }
        std::size_t hold = 0;  // keep bytes that may start a tag, drop the stray text before them
        for (auto tag : {k_close, k_function_close, k_parameter_open, k_function_open})
          hold = std::max(hold, partial_tag_suffix(buf_, tag));
        buf_.erase(0, buf_.size() - hold);
        scan_ = 0;
        return false;
      }
      buf_.erase(0, next);
      scan_ = 0;
    }
  }

 private:
  /// At "<parameter=" (after `skip` whitespace): emits the parameter once its value is complete.
  /// Returns -1 when more text is needed, 0 when it was consumed, 1 when the output ended.
  int parameter(std::vector<ParseDelta>& out, std::size_t skip, bool at_end) {
    const std::size_t key_at = skip + k_parameter_open.size();
    const std::size_t gt = buf_.find('>', key_at);
    if (gt == std::string::npos || gt - key_at > k_max_name_bytes) {
      if (!at_end && buf_.size() - key_at <= k_max_name_bytes) return -1;
      // Not a key: drop the stray "<parameter=" and go on from the text after it.
      buf_.erase(0, key_at);
      scan_ = 0;
      return 0;
    }
    const std::size_t value_at = gt + 1;
    std::size_t end = std::string::npos;
    std::string_view terminator;
    const std::size_t from = std::max(value_at, scan_);
    for (auto tag : {k_parameter_close, k_parameter_open, k_function_close, k_close}) {
      const auto p = buf_.find(tag, from);
      if (p < end) {
        end = p;
        terminator = tag;
      }
    }
    if (end == std::string::npos && !at_end) {
      scan_ = std::max(value_at, buf_.size() >= k_longest_tag ? buf_.size() - (k_longest_tag - 1) : 0);
      return -1;
    }
    const std::string key(trim(std::string_view(buf_).substr(key_at, gt - key_at)));
    std::string_view value = std::string_view(buf_).substr(value_at, (end == std::string::npos ? buf_.size() : end) - value_at);
    if (starts_with(value, "\n")) value.remove_prefix(1);
    if (!value.empty() && value.back() == '\n') value.remove_suffix(1);
    std::string frag = n_args_ == 0 ? "{" : ", ";
    frag += dump(nlohmann::json(key)) + ": " + dump(qwen3_coder_value(tools_, name_, key, value));
    add_args(out, index_, std::move(frag));
    ++n_args_;
    if (end == std::string::npos) {  // the output ended inside the value
      close_arguments(out);
      buf_.clear();
      return 1;
    }
    buf_.erase(0, end + (terminator == k_parameter_close ? terminator.size() : 0));
    scan_ = 0;
    return 0;
  }

  void close_arguments(std::vector<ParseDelta>& out) {
    if (index_ >= 0) add_args(out, index_, n_args_ == 0 ? "{}" : "}");
    index_ = -1;
    n_args_ = 0;
  }

  /// The block names no function: it is released as content, unchanged, once its closing tag
  /// (or the end of output) is there, so no delta ends inside it.
  bool fail(std::vector<ParseDelta>& out, bool at_end) {
    failed_ = true;
    const auto close = buf_.find(k_close, scan_);
    if (close == std::string::npos && !at_end) {
      scan_ = buf_.size() >= k_close.size() ? buf_.size() - (k_close.size() - 1) : 0;
      return false;
    }
    std::string raw(detail::k_open);
    if (close == std::string::npos) {
      raw += buf_;
      buf_.clear();
    } else {
      raw += buf_.substr(0, close + k_close.size());
      buf_.erase(0, close + k_close.size());
    }
    append_text(out, DeltaKind::content, raw);
    return true;
  }

  const nlohmann::json tools_;
  int index_ = -1;         // the call being written, -1 before its <function=NAME>
  std::string name_;       // its function name (for value types)
  int n_args_ = 0;         // parameters emitted for it
  std::size_t scan_ = 0;   // offset of buf_ the search for a value's (or a failed block's) end resumes from
  bool failed_ = false;    // the block names no function: waiting for its </tool_call>
};

}  // namespace

nlohmann::json qwen3_coder_value(const nlohmann::json& tools, std::string_view function, std::string_view key,
                                 std::string_view text) {
  if (lower(text) == "null") return nullptr;
  const std::string type = declared_type(tools, function, key);
  if (type.empty() || type == "string" || type == "str" || type == "text" || type == "varchar" || type == "char" ||
      type == "enum")
    return std::string(text);
  for (std::string_view p : {"int", "uint", "long", "short", "unsigned"})
    if (starts_with(type, p)) return integer_or_text(text);
  if (starts_with(type, "num") || starts_with(type, "float")) return number_or_text(text);
  if (type == "boolean" || type == "bool" || type == "binary") {
    const std::string t = lower(trim(text));
    if (t == "true") return true;
    if (t == "false") return false;
    return std::string(text);
  }
  auto j = parse_untrusted(trim(text));
  if (!j.is_discarded()) return j;
  return std::string(text);
}

std::unique_ptr<ToolCallParser> make_qwen3_coder_parser(const nlohmann::json& tools, ToolCallIdGenerator ids) {
  return std::make_unique<Qwen3CoderParser>(tools, std::move(ids));
}

}  // namespace servedeck::worker
