// Lexer of the chat-template interpreter: Jinja source -> tokens, with jinja2's whitespace
// rules as transformers configures them (trim_blocks=True, lstrip_blocks=True,
// keep_trailing_newline=False): newlines normalised to "\n", one trailing newline dropped,
// `-` strips all whitespace on its side, `+` disables lstrip/trim for its tag, comments
// removed, `{% raw %}` bodies kept verbatim.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace servedeck::worker::tmpl {

enum class TokenKind { text, var_begin, var_end, block_begin, block_end, name, string, integer, floating, op, eof };

const char* to_string(TokenKind kind);

struct Token {
  TokenKind kind = TokenKind::eof;
  std::string value;  // text, name, unescaped string, operator spelling
  int64_t int_value = 0;
  double float_value = 0.0;
  int line = 1;  // 1-based
  int column = 1;  // 1-based, in bytes
};

/// Tokenises `source`. Throws TemplateError (line/column) on an unterminated tag, comment or
/// string, or a character that starts no token.
std::vector<Token> lex(std::string_view source);

}  // namespace servedeck::worker::tmpl
