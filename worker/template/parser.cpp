// Parser of the chat-template interpreter, part 1: token helpers and statements. The
// expression grammar lives in parse_expression.cpp; both share Parser (parser_internal.hpp).
#include "worker/template/parser.hpp"

#include <algorithm>
#include <initializer_list>

#include "worker/template/chat_template.hpp"
#include "worker/template/lexer.hpp"
#include "worker/template/parser_internal.hpp"

namespace servedeck::worker::tmpl {
namespace detail {

Body Parser::parse_all() {
  Body body;
  std::string end;
  parse_body(body, {}, end);
  return body;
}

Parser::DepthGuard::DepthGuard(Parser& parser) : p(parser) {
  if (++p.depth_ > k_max_nesting) p.fail(p.cur(), "nesting deeper than " + std::to_string(k_max_nesting) + " levels");
}

void Parser::fail(const Token& t, const std::string& msg) const { throw TemplateError(msg, t.line, t.column); }

std::string Parser::describe(const Token& t) {
  switch (t.kind) {
    case TokenKind::name:
    case TokenKind::op:
    case TokenKind::integer:
    case TokenKind::floating:
      return "'" + t.value + "'";
    case TokenKind::string:
      return "string literal";
    default:
      return to_string(t.kind);
  }
}

bool Parser::skip_op(std::string_view op) {
  if (!is_op(op)) return false;
  advance();
  return true;
}

bool Parser::skip_name(std::string_view name) {
  if (!is_name(name)) return false;
  advance();
  return true;
}

void Parser::expect_op(std::string_view op) {
  if (!skip_op(op)) fail(cur(), "expected '" + std::string(op) + "', got " + describe(cur()));
}

void Parser::expect_block_end() {
  if (cur().kind != TokenKind::block_end) fail(cur(), "expected '%}', got " + describe(cur()));
  advance();
}

std::string Parser::expect_name() {
  if (cur().kind != TokenKind::name) fail(cur(), "expected a name, got " + describe(cur()));
  std::string v = cur().value;
  advance();
  return v;
}

ExprPtr Parser::make_expr(ExprKind kind, int line, int column) {
  auto e = std::make_unique<Expr>();
  e->kind = kind;
  e->line = line;
  e->column = column;
  return e;
}

// Parses statements until `{% <one of ends> %}`; leaves the parser after the end name
// (the caller parses the rest of that tag) and stores the end name in `found`.
void Parser::parse_body(Body& body, std::initializer_list<std::string_view> ends, std::string& found) {
  DepthGuard guard(*this);
  while (true) {
    const Token& t = cur();
    switch (t.kind) {
      case TokenKind::eof:
        if (ends.size() != 0) {
          std::string_view want = *ends.begin();
          for (const auto e : ends) {
            if (e.rfind("end", 0) == 0) want = e;
          }
          fail(t, "unexpected end of template, expected '{% " + std::string(want) + " %}'");
        }
        return;
      case TokenKind::text: {
        auto s = make<Stmt>(t);
        s->kind = StmtKind::text;
        s->text = t.value;
        body.push_back(std::move(s));
        advance();
        break;
      }
      case TokenKind::var_begin: {
        auto s = make<Stmt>(t);
        advance();
        s->kind = StmtKind::output;
        s->expr = parse_tuple(true);
        if (cur().kind != TokenKind::var_end) fail(cur(), "expected '}}', got " + describe(cur()));
        advance();
        body.push_back(std::move(s));
        break;
      }
      case TokenKind::block_begin: {
        const Token& name = peek();
        if (name.kind == TokenKind::name &&
            std::find(ends.begin(), ends.end(), std::string_view(name.value)) != ends.end()) {
          found = name.value;
          advance();
          advance();
          return;
        }
        advance();
        parse_statement(body);
        break;
      }
      default:
        fail(t, "unexpected " + describe(t));
    }
  }
}

void Parser::parse_statement(Body& body) {
  const Token at = cur();
  if (at.kind != TokenKind::name) fail(at, "expected a statement name after '{%', got " + describe(at));
  const std::string& kw = at.value;
  if (kw == "if") return body.push_back(parse_if());
  if (kw == "for") return body.push_back(parse_for());
  if (kw == "set") return body.push_back(parse_set());
  if (kw == "macro") return body.push_back(parse_macro());
  if (kw == "call") return body.push_back(parse_call_block());
  if (kw == "filter") return body.push_back(parse_filter_block());
  if (kw == "break" || kw == "continue") {
    auto s = make<Stmt>(at);
    s->kind = kw == "break" ? StmtKind::break_ : StmtKind::continue_;
    advance();
    expect_block_end();
    return body.push_back(std::move(s));
  }
  if (kw == "generation") {
    // transformers' AssistantTracker tag: renders its body unchanged.
    advance();
    expect_block_end();
    std::string end;
    parse_body(body, {"endgeneration"}, end);
    expect_block_end();
    return;
  }
  if (kw.rfind("end", 0) == 0 || kw == "elif" || kw == "else") fail(at, "unexpected '{% " + kw + " %}'");
  fail(at, "unsupported statement '" + kw + "'");
}

StmtPtr Parser::parse_if() {
  auto s = make<Stmt>(cur());
  s->kind = StmtKind::if_;
  advance();  // if / elif
  while (true) {
    Branch br;
    br.test = parse_tuple(true);
    expect_block_end();
    std::string end;
    parse_body(br.body, {"elif", "else", "endif"}, end);
    s->branches.push_back(std::move(br));
    if (end == "elif") continue;
    if (end == "else") {
      expect_block_end();
      parse_body(s->else_body, {"endif"}, end);
    }
    expect_block_end();
    return s;
  }
}

// Assignment target: name, tuple of names (optionally parenthesised) or, for set,
// name.attr.
ExprPtr Parser::parse_target(bool allow_attr, std::string_view end_name) {
  const Token at = cur();
  std::vector<ExprPtr> names;
  bool tuple = false;
  const bool paren = skip_op("(");
  while (true) {
    const Token nt = cur();
    std::string n = expect_name();
    ExprPtr e = make_expr(ExprKind::name, nt.line, nt.column);
    e->name = n;
    if (allow_attr && !tuple && is_op(".")) {
      advance();
      auto g = make_expr(ExprKind::getattr, nt.line, nt.column);
      g->name = expect_name();
      g->children.push_back(std::move(e));
      e = std::move(g);
    }
    names.push_back(std::move(e));
    if (!skip_op(",")) break;
    tuple = true;
    if ((paren && is_op(")")) || (!end_name.empty() && is_name(end_name)) || is_op("=")) break;
  }
  if (paren) expect_op(")");
  if (!tuple && !paren) return std::move(names[0]);
  if (!tuple && names.size() == 1) return std::move(names[0]);
  auto t = make_expr(ExprKind::tuple, at.line, at.column);
  for (auto& n : names) {
    if (n->kind != ExprKind::name) fail(at, "can only unpack into plain names");
    t->children.push_back(std::move(n));
  }
  return t;
}

StmtPtr Parser::parse_for() {
  auto s = make<Stmt>(cur());
  s->kind = StmtKind::for_;
  advance();
  s->target = parse_target(false, "in");
  if (!skip_name("in")) fail(cur(), "expected 'in' in for loop, got " + describe(cur()));
  s->expr = parse_tuple(false);
  if (skip_name("if")) s->cond = parse_tuple(true);
  if (is_name("recursive")) fail(cur(), "unsupported recursive for loop");
  expect_block_end();
  std::string end;
  parse_body(s->body, {"endfor", "else"}, end);
  if (end == "else") {
    expect_block_end();
    parse_body(s->else_body, {"endfor"}, end);
  }
  expect_block_end();
  return s;
}

StmtPtr Parser::parse_set() {
  auto s = make<Stmt>(cur());
  advance();
  s->target = parse_target(true, "");
  if (skip_op("=")) {
    s->kind = StmtKind::set;
    s->expr = parse_tuple(true);
    expect_block_end();
    return s;
  }
  s->kind = StmtKind::set_block;
  if (s->target->kind != ExprKind::name) fail(cur(), "block set needs a plain name target");
  if (is_op("|")) s->expr = parse_filters(block_placeholder(cur()));
  expect_block_end();
  std::string end;
  parse_body(s->body, {"endset"}, end);
  expect_block_end();
  return s;
}

ExprPtr Parser::block_placeholder(const Token& at) {
  auto e = make_expr(ExprKind::name, at.line, at.column);
  e->name = k_block_name;
  return e;
}

void Parser::parse_params(std::vector<Param>& params) {
  expect_op("(");
  while (!is_op(")")) {
    if (!params.empty()) expect_op(",");
    if (is_op(")")) break;
    Param p;
    const Token at = cur();
    p.name = expect_name();
    for (const auto& q : params) {
      if (q.name == p.name) fail(at, "duplicate parameter '" + p.name + "'");
    }
    if (skip_op("=")) {
      p.default_value = parse_expression(true);
    } else if (!params.empty() && params.back().default_value) {
      fail(at, "parameter '" + p.name + "' without default follows a parameter with default");
    }
    params.push_back(std::move(p));
  }
  advance();
}

StmtPtr Parser::parse_macro() {
  auto s = make<Stmt>(cur());
  s->kind = StmtKind::macro;
  advance();
  s->name = expect_name();
  parse_params(s->params);
  expect_block_end();
  std::string end;
  parse_body(s->body, {"endmacro"}, end);
  if (cur().kind == TokenKind::name) advance();  // {% endmacro name %}
  expect_block_end();
  return s;
}

StmtPtr Parser::parse_call_block() {
  auto s = make<Stmt>(cur());
  s->kind = StmtKind::call_block;
  advance();
  if (is_op("(")) parse_params(s->params);
  s->expr = parse_expression(true);
  if (s->expr->kind != ExprKind::call) fail(cur(), "expected a call after '{% call'");
  expect_block_end();
  std::string end;
  parse_body(s->body, {"endcall"}, end);
  expect_block_end();
  return s;
}

StmtPtr Parser::parse_filter_block() {
  auto s = make<Stmt>(cur());
  s->kind = StmtKind::filter_block;
  const Token at = cur();
  // `filter name(args)|name2` reuses the filter-expression parser with `|` implied.
  auto operand = block_placeholder(at);
  s->expr = parse_filter(std::move(operand));
  if (is_op("|")) s->expr = parse_filters(std::move(s->expr));
  expect_block_end();
  std::string end;
  parse_body(s->body, {"endfilter"}, end);
  expect_block_end();
  return s;
}

}  // namespace detail

Body parse_template(std::string_view source) { return detail::Parser(lex(source)).parse_all(); }

}  // namespace servedeck::worker::tmpl
