#include "worker/parsers/tool_call_parser.hpp"

#include "common/json_limits.hpp"
#include "worker/parsers/qwen3_coder_parser.hpp"
#include "worker/parsers/tool_call_block.hpp"

#include <algorithm>
#include <cctype>
#include <random>
#include <utility>

namespace servedeck::worker {
namespace {

constexpr std::string_view k_key_open = "<arg_key>";
constexpr std::string_view k_key_close = "</arg_key>";
constexpr std::string_view k_value_open = "<arg_value>";
constexpr std::string_view k_value_close = "</arg_value>";

using detail::BlockParser;
using detail::dump;
using detail::k_close;
using detail::k_open;
using detail::trim;

class PassThrough final : public ToolCallParser {
 public:
  void push(std::string_view text, std::vector<ParseDelta>& out) override {
    append_text(out, DeltaKind::content, text);
  }
  void finish(std::vector<ParseDelta>&) override {}
  int calls() const override { return 0; }
};

// Hermes calls stream their arguments when the body starts the usual way,
// {"name": "<name>", "arguments": {  — the start delta goes out once the name is known and the
// arguments text follows as it arrives, holding back a final "}" (it may close the outer object)
// and whitespace or a partial closing tag after it. Any other shape (e.g. "arguments" first) is
// buffered and parsed whole at the closing tag.
class HermesParser final : public BlockParser {
 public:
  using BlockParser::BlockParser;

 protected:
  void begin_block() override {
    index_ = -1;
    streamed_ = 0;
  }

  bool on_body(std::vector<ParseDelta>& out, bool at_end) override {
    const auto pos = buf_.find(k_close);
    const bool closed = pos != std::string::npos;
    if (index_ < 0) {
      std::string name;
      std::size_t len = 0;
      const Prefix m = match_prefix(closed ? std::string_view(buf_).substr(0, pos) : std::string_view(buf_), name, len);
      if (m == Prefix::matched) {
        index_ = start_call(out, std::move(name));
        buf_.erase(0, len);
        return on_body(out, at_end);
      }
      if (m == Prefix::need_more && !closed && !at_end) return false;
      return parse_whole_block(out, at_end);
    }
    if (!closed && !at_end) {
      // Hold back from the last '}' when only whitespace or a partial closing tag follows it.
      std::size_t keep = buf_.size() - partial_tag_suffix(buf_, k_close);
      std::size_t k = keep;
      while (k > 0 && std::isspace(static_cast<unsigned char>(buf_[k - 1]))) --k;
      if (k > 0 && buf_[k - 1] == '}') keep = k - 1;
      emit_args(out, buf_.substr(0, keep));
      buf_.erase(0, keep);
      return false;
    }
    std::string rest = closed ? buf_.substr(0, pos) : buf_;
    buf_.erase(0, closed ? pos + k_close.size() : buf_.size());
    while (!rest.empty() && std::isspace(static_cast<unsigned char>(rest.back()))) rest.pop_back();
    if (!rest.empty() && rest.back() == '}') rest.pop_back();  // the outer object's brace
    emit_args(out, rest);
    if (streamed_ == 0) add_args(out, index_, "{}");
    return true;
  }

 private:
  enum class Prefix { matched, need_more, mismatch };

  // Matches `{ "name" : "<name>" , "arguments" : ` followed by '{' (not consumed).
  static Prefix match_prefix(std::string_view b, std::string& name, std::size_t& len) {
    std::size_t i = 0;
    auto ws = [&] { while (i < b.size() && std::isspace(static_cast<unsigned char>(b[i]))) ++i; };
    auto lit = [&](std::string_view l) -> Prefix {
      const std::size_t n = std::min(l.size(), b.size() - i);
      if (b.substr(i, n) != l.substr(0, n)) return Prefix::mismatch;
      if (n < l.size()) return Prefix::need_more;
      i += n;
      return Prefix::matched;
    };
    Prefix r;
    ws();
    if ((r = lit("{")) != Prefix::matched) return r;
    ws();
    if ((r = lit("\"name\"")) != Prefix::matched) return r;
    ws();
    if ((r = lit(":")) != Prefix::matched) return r;
    ws();
    if ((r = lit("\"")) != Prefix::matched) return r;
    const std::size_t name_begin = i;
    while (i < b.size() && b[i] != '"') {
      if (b[i] == '\\') return Prefix::mismatch;  // escaped names: parse the whole block
      ++i;
    }
    if (i >= b.size()) return Prefix::need_more;
    name = std::string(b.substr(name_begin, i - name_begin));
    ++i;
    ws();
    if ((r = lit(",")) != Prefix::matched) return r;
    ws();
    if ((r = lit("\"arguments\"")) != Prefix::matched) return r;
    ws();
    if ((r = lit(":")) != Prefix::matched) return r;
    ws();
    if (i >= b.size()) return Prefix::need_more;
    if (b[i] != '{' || name.empty()) return Prefix::mismatch;
    len = i;
    return Prefix::matched;
  }

  void emit_args(std::vector<ParseDelta>& out, const std::string& text) {
    if (text.empty()) return;
    // Leading whitespace before the arguments object is not part of it.
    if (streamed_ == 0) {
      const auto b = text.find_first_not_of(" \t\r\n");
      if (b == std::string::npos) return;
      add_args(out, index_, text.substr(b));
      streamed_ += text.size() - b;
      return;
    }
    add_args(out, index_, text);
    streamed_ += text.size();
  }

  bool parse_whole_block(std::vector<ParseDelta>& out, bool at_end) {
    const auto pos = buf_.find(k_close);
    if (pos == std::string::npos && !at_end) return false;
    const std::string body = pos == std::string::npos ? buf_ : buf_.substr(0, pos);
    const bool closed = pos != std::string::npos;
    buf_.erase(0, closed ? pos + k_close.size() : buf_.size());
    const auto j = parse_untrusted(trim(body));
    if (j.is_object() && j.contains("name") && j["name"].is_string()) {
      const int index = start_call(out, j["name"].get<std::string>());
      std::string args = "{}";
      if (j.contains("arguments")) {
        const auto& a = j["arguments"];
        args = a.is_string() ? a.get<std::string>() : dump(a);
      } else if (j.contains("parameters")) {
        args = dump(j["parameters"]);
      }
      add_args(out, index, std::move(args));
    } else {
      std::string raw = std::string(k_open) + body + (closed ? std::string(k_close) : "");
      append_text(out, DeltaKind::content, raw);
    }
    return true;
  }

  int index_ = -1;
  std::size_t streamed_ = 0;  // argument bytes emitted for the current call
};

class GlmParser final : public BlockParser {
 public:
  GlmParser(const nlohmann::json& tools, ToolCallIdGenerator ids)
      : BlockParser(std::move(ids)), tools_(tools) {}

 protected:
  void begin_block() override {
    index_ = -1;
    name_.clear();
    n_args_ = 0;
  }

  bool on_body(std::vector<ParseDelta>& out, bool at_end) override {
    if (index_ < 0) {
      // The name runs to the first newline, <arg_key> or </tool_call>.
      std::size_t end = buf_.find('\n');
      for (auto tag : {k_key_open, k_close}) {
        const auto p = buf_.find(tag);
        if (p != std::string::npos && (end == std::string::npos || p < end)) end = p;
      }
      if (end == std::string::npos) {
        if (!at_end) return false;
        end = buf_.size();
      }
      const std::string name(trim(std::string_view(buf_).substr(0, end)));
      if (name.empty() || name.find_first_of("<>{}\" ") != std::string::npos) {
        return fail(out);
      }
      name_ = name;
      raw_block_ += buf_.substr(0, end);
      buf_.erase(0, end);
      index_ = start_call(out, name_);
    }
    for (;;) {
      const std::size_t skip = buf_.find_first_not_of(" \t\r\n");
      const std::string_view rest = skip == std::string::npos ? std::string_view() : std::string_view(buf_).substr(skip);
      if (rest.substr(0, k_close.size()) == k_close) {
        add_args(out, index_, n_args_ == 0 ? "{}" : "}");
        buf_.erase(0, skip + k_close.size());
        return true;
      }
      if (rest.substr(0, k_key_open.size()) == k_key_open) {
        const auto key_end = rest.find(k_key_close);
        const auto v_open = key_end == std::string_view::npos ? key_end : rest.find(k_value_open, key_end);
        const auto v_close = v_open == std::string_view::npos ? v_open : rest.find(k_value_close, v_open);
        if (v_close == std::string_view::npos) {
          if (!at_end) return false;
          add_args(out, index_, n_args_ == 0 ? "{}" : "}");  // truncated pair dropped
          buf_.clear();
          return true;
        }
        const std::string key(trim(rest.substr(k_key_open.size(), key_end - k_key_open.size())));
        const std::string_view value =
            rest.substr(v_open + k_value_open.size(), v_close - v_open - k_value_open.size());
        std::string frag = n_args_ == 0 ? "{" : ", ";
        frag += dump(nlohmann::json(key)) + ": " + dump(convert(key, value));
        add_args(out, index_, std::move(frag));
        ++n_args_;
        buf_.erase(0, skip + v_close + k_value_close.size());
        continue;
      }
      // Neither tag (yet): wait while what we have may still become one, else skip to the next.
      if (!at_end && (rest.empty() || std::string_view(k_close).substr(0, rest.size()) == rest ||
                      std::string_view(k_key_open).substr(0, rest.size()) == rest)) {
        return false;
      }
      std::size_t next = std::string::npos;
      for (auto tag : {k_key_open, k_close}) {
        const auto p = buf_.find(tag, skip == std::string::npos ? buf_.size() : skip + 1);
        if (p != std::string::npos && (next == std::string::npos || p < next)) next = p;
      }
      if (next == std::string::npos) {
        if (!at_end) {
          // Keep bytes that may start a tag; drop the garbage before them.
          const std::size_t hold = std::max(partial_tag_suffix(buf_, k_key_open), partial_tag_suffix(buf_, k_close));
          buf_.erase(0, buf_.size() - hold);
          return false;
        }
        add_args(out, index_, n_args_ == 0 ? "{}" : "}");
        buf_.clear();
        return true;
      }
      buf_.erase(0, next);
    }
  }

 private:
  bool fail(std::vector<ParseDelta>& out) {
    const auto close = buf_.find(k_close);
    std::string raw = std::string(k_open);
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

  nlohmann::json convert(const std::string& key, std::string_view value) const {
    if (!tools_.is_array()) return std::string(value);
    for (const auto& t : tools_) {
      if (!t.is_object()) continue;
      const auto fit = t.find("function");
      if (fit == t.end() || !fit->is_object()) continue;
      const auto nit = fit->find("name");
      if (nit == fit->end() || !nit->is_string() || nit->get<std::string>() != name_) continue;
      const auto pit = fit->find("parameters");
      if (pit == fit->end() || !pit->is_object()) break;
      const auto props = pit->find("properties");
      if (props == pit->end() || !props->is_object()) break;
      const auto prop = props->find(key);
      if (prop == props->end() || !prop->is_object()) break;
      const auto type = prop->find("type");
      if (type == prop->end()) break;
      const bool is_string = (type->is_string() && type->get<std::string>() == "string");
      if (is_string) break;
      auto j = parse_untrusted(trim(value));
      if (!j.is_discarded()) return j;
      break;
    }
    return std::string(value);
  }

  const nlohmann::json tools_;
  int index_ = -1;
  std::string name_;
  int n_args_ = 0;
};

}  // namespace

std::string_view to_string(ToolParserKind k) {
  switch (k) {
    case ToolParserKind::none: return "none";
    case ToolParserKind::hermes: return "hermes";
    case ToolParserKind::glm: return "glm";
    case ToolParserKind::qwen3_coder: return "qwen3_coder";
  }
  return "unknown";
}

bool parse_tool_parser_kind(std::string_view s, ToolParserKind& out) {
  if (s == "hermes" || s == "qwen3" || s == "qwen") out = ToolParserKind::hermes;
  else if (s == "glm" || s == "glm45" || s == "glm4_moe") out = ToolParserKind::glm;
  else if (s == "qwen3_coder" || s == "qwen3_xml") out = ToolParserKind::qwen3_coder;
  else if (s == "none") out = ToolParserKind::none;
  else return false;
  return true;
}

ToolCallIdGenerator random_tool_call_ids() {
  auto rng = std::make_shared<std::mt19937_64>(std::random_device{}());
  return [rng] {
    static constexpr char hex[] = "0123456789abcdef";
    std::string id = "call_";
    for (int i = 0; i < 24; ++i) id += hex[(*rng)() & 15];
    return id;
  };
}

std::unique_ptr<ToolCallParser> make_tool_call_parser(ToolParserKind kind,
                                                      const nlohmann::json& tools,
                                                      ToolCallIdGenerator ids) {
  if (!ids) ids = random_tool_call_ids();
  switch (kind) {
    case ToolParserKind::hermes: return std::make_unique<HermesParser>(std::move(ids));
    case ToolParserKind::glm: return std::make_unique<GlmParser>(tools, std::move(ids));
    case ToolParserKind::qwen3_coder: return make_qwen3_coder_parser(tools, std::move(ids));
    case ToolParserKind::none: break;
  }
  return std::make_unique<PassThrough>();
}

}  // namespace servedeck::worker
