#include "worker/template/lexer.hpp"

#include <algorithm>
#include <cstring>

#include "common/utf8_encode.hpp"
#include "worker/template/chat_template.hpp"

namespace servedeck::worker::tmpl {

namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }
bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool is_name_char(char c) { return is_name_start(c) || is_digit(c); }

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

class Lexer {
 public:
  explicit Lexer(std::string_view source) {
    // jinja2 normalises \r\n and \r to \n and drops one trailing newline.
    src_.reserve(source.size());
    for (size_t i = 0; i < source.size(); ++i) {
      if (source[i] == '\r') {
        src_.push_back('\n');
        if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
      } else {
        src_.push_back(source[i]);
      }
    }
    if (!src_.empty() && src_.back() == '\n') src_.pop_back();
    line_starts_.push_back(0);
    for (size_t i = 0; i < src_.size(); ++i) {
      if (src_[i] == '\n') line_starts_.push_back(i + 1);
    }
  }

  std::vector<Token> run() {
    size_t pos = 0;
    bool line_starting = true;
    const size_t n = src_.size();
    while (pos < n) {
      const size_t start = find_tag(pos);
      if (start == std::string::npos) {
        push_text(pos, src_.substr(pos));
        break;
      }
      std::string text = src_.substr(pos, start - pos);
      const char tag = src_[start + 1];
      size_t after = start + 2;
      const char ctrl = (after < n && (src_[after] == '-' || src_[after] == '+')) ? src_[after] : '\0';
      if (ctrl == '-') {
        while (!text.empty() && is_space(text.back())) text.pop_back();
      } else if (ctrl != '+' && tag != '{') {
        // lstrip_blocks: drop spaces/tabs between the line start and a block or comment tag.
        const size_t nl = text.rfind('\n');
        const size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
        if ((l_pos > 0 || line_starting) && l_pos < text.size() &&
            std::all_of(text.begin() + static_cast<std::ptrdiff_t>(l_pos), text.end(),
                        [](char c) { return c == ' ' || c == '\t' || c == '\f' || c == '\v'; })) {
          text.resize(l_pos);
        }
      }
      push_text(pos, std::move(text));
      if (ctrl) ++after;
      if (tag == '#') {
        pos = lex_comment(start, after);
      } else if (tag == '%' && is_raw(after)) {
        pos = lex_raw(start, after);
      } else {
        pos = lex_tag(start, after, tag == '{');
      }
      line_starting = pos > 0 && src_[pos - 1] == '\n';
    }
    Token eof;
    eof.kind = TokenKind::eof;
    set_pos(eof, src_.size());
    tokens_.push_back(eof);
    return std::move(tokens_);
  }

 private:
  std::string src_;
  std::vector<size_t> line_starts_;
  std::vector<Token> tokens_;

  [[noreturn]] void fail(size_t offset, const std::string& msg) const {
    int line = 0;
    int col = 0;
    position(offset, line, col);
    throw TemplateError(msg, line, col);
  }

  void position(size_t offset, int& line, int& col) const {
    const auto it = std::upper_bound(line_starts_.begin(), line_starts_.end(), offset);
    const size_t idx = static_cast<size_t>(it - line_starts_.begin()) - 1;
    line = static_cast<int>(idx) + 1;
    col = static_cast<int>(offset - line_starts_[idx]) + 1;
  }

  void set_pos(Token& t, size_t offset) const { position(offset, t.line, t.column); }

  size_t find_tag(size_t from) const {
    for (size_t i = from; i + 1 < src_.size(); ++i) {
      if (src_[i] == '{' && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#')) return i;
    }
    return std::string::npos;
  }

  void push_text(size_t offset, std::string text) {
    if (text.empty()) return;
    Token t;
    t.kind = TokenKind::text;
    t.value = std::move(text);
    set_pos(t, offset);
    tokens_.push_back(std::move(t));
  }

  void push(TokenKind kind, size_t offset, std::string value) {
    Token t;
    t.kind = kind;
    t.value = std::move(value);
    set_pos(t, offset);
    tokens_.push_back(std::move(t));
  }

  // After a `%}` or `#}` (not `-`/`+` controlled): trim_blocks drops one newline.
  size_t trim_after_block(size_t pos) const { return (pos < src_.size() && src_[pos] == '\n') ? pos + 1 : pos; }
  size_t skip_space(size_t pos) const {
    while (pos < src_.size() && is_space(src_[pos])) ++pos;
    return pos;
  }

  size_t lex_comment(size_t start, size_t after) {
    const size_t end = src_.find("#}", after);
    if (end == std::string::npos) fail(start, "unterminated comment '{#'");
    const char ctrl = end > after && (src_[end - 1] == '-' || src_[end - 1] == '+') ? src_[end - 1] : '\0';
    const size_t pos = end + 2;
    if (ctrl == '-') return skip_space(pos);
    if (ctrl == '+') return pos;
    return trim_after_block(pos);
  }

  // `{% raw %}` (with optional -/+ controls) at `after`?
  bool is_raw(size_t after) const {
    size_t p = skip_space(after);
    if (src_.compare(p, 3, "raw") != 0) return false;
    p += 3;
    if (p < src_.size() && is_name_char(src_[p])) return false;
    p = skip_space(p);
    if (p < src_.size() && (src_[p] == '-' || src_[p] == '+')) ++p;
    return src_.compare(p, 2, "%}") == 0;
  }

  size_t lex_raw(size_t start, size_t after) {
    size_t p = skip_space(after) + 3;
    p = skip_space(p);
    char ctrl = '\0';
    if (src_[p] == '-' || src_[p] == '+') ctrl = src_[p++];
    p += 2;  // %}
    // note: jinja2 applies trim_blocks after {% endraw %} but not after {% raw %}.
    if (ctrl == '-') p = skip_space(p);
    // Find {%[-+]? endraw [-+]?%}
    for (size_t q = src_.find("{%", p); q != std::string::npos; q = src_.find("{%", q + 2)) {
      size_t r = q + 2;
      char open_ctrl = '\0';
      if (r < src_.size() && (src_[r] == '-' || src_[r] == '+')) open_ctrl = src_[r++];
      r = skip_space(r);
      if (src_.compare(r, 6, "endraw") != 0) continue;
      r = skip_space(r + 6);
      char close_ctrl = '\0';
      if (r < src_.size() && (src_[r] == '-' || src_[r] == '+')) close_ctrl = src_[r++];
      if (src_.compare(r, 2, "%}") != 0) continue;
      std::string body = src_.substr(p, q - p);
      if (open_ctrl == '-') {
        while (!body.empty() && is_space(body.back())) body.pop_back();
      }
      push_text(p, std::move(body));
      r += 2;
      if (close_ctrl == '-') return skip_space(r);
      if (close_ctrl == '+') return r;
      return trim_after_block(r);
    }
    fail(start, "unterminated '{% raw %}' block (no '{% endraw %}')");
  }

  size_t lex_tag(size_t start, size_t pos, bool is_var) {
    push(is_var ? TokenKind::var_begin : TokenKind::block_begin, start, is_var ? "{{" : "{%");
    int depth = 0;
    const size_t n = src_.size();
    while (true) {
      pos = skip_space(pos);
      if (pos >= n) fail(start, is_var ? "unterminated '{{' (missing '}}')" : "unterminated '{%' (missing '%}')");
      if (depth == 0) {
        if (is_var) {
          if (src_.compare(pos, 3, "-}}") == 0) {
            push(TokenKind::var_end, pos, "}}");
            return skip_space(pos + 3);
          }
          if (src_.compare(pos, 2, "}}") == 0) {
            push(TokenKind::var_end, pos, "}}");
            return pos + 2;
          }
        } else {
          if (src_.compare(pos, 3, "-%}") == 0) {
            push(TokenKind::block_end, pos, "%}");
            return skip_space(pos + 3);
          }
          if (src_.compare(pos, 3, "+%}") == 0) {
            push(TokenKind::block_end, pos, "%}");
            return pos + 3;
          }
          if (src_.compare(pos, 2, "%}") == 0) {
            push(TokenKind::block_end, pos, "%}");
            return trim_after_block(pos + 2);
          }
        }
      }
      const char c = src_[pos];
      if (is_name_start(c)) {
        size_t e = pos;
        while (e < n && is_name_char(src_[e])) ++e;
        push(TokenKind::name, pos, src_.substr(pos, e - pos));
        pos = e;
      } else if (is_digit(c)) {
        pos = lex_number(pos);
      } else if (c == '\'' || c == '"') {
        pos = lex_string(pos);
      } else {
        static const char* const two[] = {"//", "**", "==", "!=", "<=", ">="};
        std::string op;
        for (const char* t : two) {
          if (src_.compare(pos, 2, t) == 0) op = t;
        }
        if (op.empty()) {
          if (!std::strchr("+-/*%~[](){}=<>.,:|;", c) || c == '\0') {
            fail(pos, std::string("unexpected character '") + c + "' in " + (is_var ? "'{{ }}'" : "'{% %}'"));
          }
          op = std::string(1, c);
        }
        if (op == "(" || op == "[" || op == "{") ++depth;
        if ((op == ")" || op == "]" || op == "}") && depth > 0) --depth;
        push(TokenKind::op, pos, op);
        pos += op.size();
      }
    }
  }

  size_t lex_number(size_t pos) {
    const size_t n = src_.size();
    const bool after_dot = !tokens_.empty() && tokens_.back().kind == TokenKind::op && tokens_.back().value == ".";
    size_t e = pos;
    auto digits = [&](size_t p) {
      while (p < n && (is_digit(src_[p]) || (src_[p] == '_' && p + 1 < n && is_digit(src_[p + 1])))) ++p;
      return p;
    };
    e = digits(e);
    bool is_float = false;
    if (!after_dot && e + 1 < n && src_[e] == '.' && is_digit(src_[e + 1])) {
      e = digits(e + 1);
      is_float = true;
    }
    if (!after_dot && e < n && (src_[e] == 'e' || src_[e] == 'E')) {
      size_t x = e + 1;
      if (x < n && (src_[x] == '+' || src_[x] == '-')) ++x;
      if (x < n && is_digit(src_[x])) {
        e = digits(x);
        is_float = true;
      }
    }
    std::string text;
    for (size_t i = pos; i < e; ++i) {
      if (src_[i] != '_') text.push_back(src_[i]);
    }
    Token t;
    set_pos(t, pos);
    t.value = text;
    if (is_float) {
      t.kind = TokenKind::floating;
      t.float_value = std::strtod(text.c_str(), nullptr);
    } else {
      t.kind = TokenKind::integer;
      errno = 0;
      const unsigned long long v = std::strtoull(text.c_str(), nullptr, 10);
      if (errno != 0 || v > static_cast<unsigned long long>(INT64_MAX)) fail(pos, "integer literal " + text + " out of range");
      t.int_value = static_cast<int64_t>(v);
    }
    tokens_.push_back(std::move(t));
    return e;
  }

  // Python string literal with unicode-escape decoding (as jinja2 does); unknown escapes
  // keep their backslash.
  size_t lex_string(size_t pos) {
    const char quote = src_[pos];
    std::string out;
    size_t p = pos + 1;
    const size_t n = src_.size();
    while (true) {
      if (p >= n) fail(pos, "unterminated string literal");
      const char c = src_[p];
      if (c == quote) break;
      if (c != '\\') {
        out.push_back(c);
        ++p;
        continue;
      }
      if (p + 1 >= n) fail(pos, "unterminated string literal");
      const char e = src_[p + 1];
      p += 2;
      switch (e) {
        case 'n': out.push_back('\n'); break;
        case 't': out.push_back('\t'); break;
        case 'r': out.push_back('\r'); break;
        case 'b': out.push_back('\b'); break;
        case 'f': out.push_back('\f'); break;
        case 'v': out.push_back('\v'); break;
        case 'a': out.push_back('\a'); break;
        case '0': case '1': case '2': case '3': case '4': case '5': case '6': case '7': {
          uint32_t v = static_cast<uint32_t>(e - '0');
          for (int k = 0; k < 2 && p < n && src_[p] >= '0' && src_[p] <= '7'; ++k) v = v * 8 + static_cast<uint32_t>(src_[p++] - '0');
          servedeck::append_utf8(out, v);
          break;
        }
        case '\\': case '\'': case '"': out.push_back(e); break;
        case '\n': break;  // line continuation
        case 'x': case 'u': case 'U': {
          const int len = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          uint32_t v = 0;
          for (int k = 0; k < len; ++k) {
            const int h = p < n ? hex_value(src_[p]) : -1;
            if (h < 0) fail(p, std::string("truncated \\") + e + " escape in string literal");
            v = v * 16 + static_cast<uint32_t>(h);
            ++p;
          }
          if (v > 0x10FFFF) fail(p, "escape \\U beyond U+10FFFF in string literal");
          servedeck::append_utf8(out, v);
          break;
        }
        default:
          out.push_back('\\');
          out.push_back(e);
      }
    }
    push(TokenKind::string, pos, std::move(out));
    return p + 1;
  }
};

}  // namespace

const char* to_string(TokenKind kind) {
  switch (kind) {
    case TokenKind::text: return "text";
    case TokenKind::var_begin: return "'{{'";
    case TokenKind::var_end: return "'}}'";
    case TokenKind::block_begin: return "'{%'";
    case TokenKind::block_end: return "'%}'";
    case TokenKind::name: return "name";
    case TokenKind::string: return "string";
    case TokenKind::integer: return "integer";
    case TokenKind::floating: return "float";
    case TokenKind::op: return "operator";
    case TokenKind::eof: return "end of template";
  }
  return "?";
}

std::vector<Token> lex(std::string_view source) { return Lexer(source).run(); }

}  // namespace servedeck::worker::tmpl
