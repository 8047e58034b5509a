// Internal to the chat-template parser: the recursive-descent Parser shared by its two
// translation units, parser.cpp (token helpers, statements) and parse_expression.cpp
// (expression grammar, filters, tests, subscripts, calls). Not part of the public API; the
// only entry point is parse_template() in parser.hpp. Include it from nowhere else.
#pragma once

#include <algorithm>
#include <cstddef>
#include <initializer_list>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "worker/template/ast.hpp"
#include "worker/template/lexer.hpp"

namespace servedeck::worker::tmpl::detail {

// note: real templates nest < 15 levels; 256 keeps recursion well inside an 8 MiB stack
// even under ASan.
inline constexpr int k_max_nesting = 256;

/// One parse over a token stream from lex() (ending in an eof token). Every parse_* method
/// starts at the current token and leaves the parser after what it consumed; errors throw
/// TemplateError naming the offending token's line:column.
class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : tokens_(std::move(tokens)) {}

  /// Parses the whole stream into top-level statements.
  Body parse_all();

 private:
  std::vector<Token> tokens_;
  size_t pos_ = 0;
  int depth_ = 0;

  // Counts one level of recursion; past k_max_nesting it fails at the current token.
  struct DepthGuard {
    Parser& p;
    explicit DepthGuard(Parser& parser);
    ~DepthGuard() { --p.depth_; }
    DepthGuard(const DepthGuard&) = delete;
    DepthGuard& operator=(const DepthGuard&) = delete;
  };

  // ---- token helpers (parser.cpp; the trivial accessors stay inline here) ----

  const Token& cur() const { return tokens_[pos_]; }
  const Token& peek(size_t k = 1) const { return tokens_[std::min(pos_ + k, tokens_.size() - 1)]; }
  void advance() {
    if (pos_ + 1 < tokens_.size()) ++pos_;
  }

  [[noreturn]] void fail(const Token& t, const std::string& msg) const;
  static std::string describe(const Token& t);

  bool is_op(std::string_view op) const { return cur().kind == TokenKind::op && cur().value == op; }
  bool is_name(std::string_view name) const { return cur().kind == TokenKind::name && cur().value == name; }
  bool skip_op(std::string_view op);
  bool skip_name(std::string_view name);
  void expect_op(std::string_view op);
  void expect_block_end();
  std::string expect_name();

  template <class Node>
  static std::unique_ptr<Node> make(const Token& at) {
    auto n = std::make_unique<Node>();
    n->line = at.line;
    n->column = at.column;
    return n;
  }

  static ExprPtr make_expr(ExprKind kind, int line, int column);

  // ---- statements (parser.cpp) ----

  // Parses statements until `{% <one of ends> %}`; leaves the parser after the end name
  // (the caller parses the rest of that tag) and stores the end name in `found`.
  void parse_body(Body& body, std::initializer_list<std::string_view> ends, std::string& found);
  void parse_statement(Body& body);
  StmtPtr parse_if();
  // Assignment target: name, tuple of names (optionally parenthesised) or, for set,
  // name.attr.
  ExprPtr parse_target(bool allow_attr, std::string_view end_name);
  StmtPtr parse_for();
  StmtPtr parse_set();
  ExprPtr block_placeholder(const Token& at);
  void parse_params(std::vector<Param>& params);
  StmtPtr parse_macro();
  StmtPtr parse_call_block();
  StmtPtr parse_filter_block();

  // ---- expressions (parse_expression.cpp) ----

  ExprPtr parse_filters(ExprPtr node);
  // Current token is `|` or the `filter` keyword; parses name and optional arguments.
  ExprPtr parse_filter(ExprPtr operand);
  // parse_tuple: comma-separated expressions; a single one without comma is itself.
  ExprPtr parse_tuple(bool with_condexpr, bool explicit_paren = false);
  ExprPtr parse_expression(bool with_condexpr);
  ExprPtr parse_condexpr();
  ExprPtr binary(const char* op, ExprPtr l, ExprPtr r, const Token& at);
  ExprPtr parse_or();
  ExprPtr parse_and();
  ExprPtr parse_not();
  ExprPtr parse_compare();
  ExprPtr parse_math1();
  ExprPtr parse_concat();
  ExprPtr parse_math2();
  ExprPtr parse_pow();
  ExprPtr parse_unary(bool with_filter);
  ExprPtr parse_primary();
  ExprPtr parse_postfix(ExprPtr node);
  ExprPtr parse_filter_expr(ExprPtr node);
  ExprPtr parse_subscript(ExprPtr node);
  ExprPtr parse_subscribed();
  void parse_call_args(std::vector<Arg>& args);
  ExprPtr parse_call(ExprPtr callee);
  ExprPtr parse_test(ExprPtr node);
};

}  // namespace servedeck::worker::tmpl::detail
