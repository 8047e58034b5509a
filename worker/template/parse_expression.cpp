// Parser of the chat-template interpreter, part 2: the expression grammar (jinja2 3.1's
// precedence, see parser.hpp), filters, tests, subscripts, slices and calls. Statements and
// the token helpers live in parser.cpp; both share Parser (parser_internal.hpp).
#include <string>
#include <utility>
#include <vector>

#include "worker/template/parser_internal.hpp"

namespace servedeck::worker::tmpl::detail {

ExprPtr Parser::parse_filters(ExprPtr node) {
  while (is_op("|")) node = parse_filter(std::move(node));
  return node;
}

// Current token is `|` or the `filter` keyword; parses name and optional arguments.
ExprPtr Parser::parse_filter(ExprPtr operand) {
  const Token at = cur();
  advance();
  const Token nt = cur();
  auto f = make_expr(ExprKind::filter, nt.line, nt.column);
  f->name = expect_name();
  while (is_op(".")) {
    advance();
    f->name += "." + expect_name();
  }
  f->children.push_back(std::move(operand));
  if (is_op("(")) parse_call_args(f->args);
  (void)at;
  return f;
}

// parse_tuple: comma-separated expressions; a single one without comma is itself.
ExprPtr Parser::parse_tuple(bool with_condexpr, bool explicit_paren) {
  const Token at = cur();
  std::vector<ExprPtr> items;
  bool is_tuple = false;
  while (true) {
    if (!items.empty()) expect_op(",");
    if (cur().kind == TokenKind::var_end || cur().kind == TokenKind::block_end || is_op(")")) break;
    if (!with_condexpr && is_name("if")) break;
    items.push_back(parse_expression(with_condexpr));
    if (is_op(",")) {
      is_tuple = true;
    } else {
      break;
    }
  }
  if (!is_tuple) {
    if (!items.empty()) return std::move(items[0]);
    if (!explicit_paren) fail(cur(), "expected an expression, got " + describe(cur()));
  }
  auto t = make_expr(ExprKind::tuple, at.line, at.column);
  t->children = std::move(items);
  return t;
}

ExprPtr Parser::parse_expression(bool with_condexpr) {
  DepthGuard guard(*this);
  return with_condexpr ? parse_condexpr() : parse_or();
}

ExprPtr Parser::parse_condexpr() {
  const Token at = cur();
  ExprPtr expr1 = parse_or();
  while (skip_name("if")) {
    auto c = make_expr(ExprKind::cond, at.line, at.column);
    ExprPtr test = parse_or();
    ExprPtr other;
    if (skip_name("else")) other = parse_condexpr();
    c->children.push_back(std::move(test));
    c->children.push_back(std::move(expr1));
    c->children.push_back(std::move(other));
    expr1 = std::move(c);
  }
  return expr1;
}

ExprPtr Parser::binary(const char* op, ExprPtr l, ExprPtr r, const Token& at) {
  auto b = make_expr(ExprKind::binary, at.line, at.column);
  b->name = op;
  b->children.push_back(std::move(l));
  b->children.push_back(std::move(r));
  return b;
}

ExprPtr Parser::parse_or() {
  ExprPtr left = parse_and();
  while (is_name("or")) {
    const Token at = cur();
    advance();
    left = binary("or", std::move(left), parse_and(), at);
  }
  return left;
}

ExprPtr Parser::parse_and() {
  ExprPtr left = parse_not();
  while (is_name("and")) {
    const Token at = cur();
    advance();
    left = binary("and", std::move(left), parse_not(), at);
  }
  return left;
}

ExprPtr Parser::parse_not() {
  if (is_name("not")) {
    DepthGuard guard(*this);
    const Token at = cur();
    advance();
    auto u = make_expr(ExprKind::unary, at.line, at.column);
    u->name = "not";
    u->children.push_back(parse_not());
    return u;
  }
  return parse_compare();
}

ExprPtr Parser::parse_compare() {
  const Token at = cur();
  ExprPtr first = parse_math1();
  std::vector<std::string> ops;
  std::vector<ExprPtr> rest;
  while (true) {
    const Token& t = cur();
    if (t.kind == TokenKind::op &&
        (t.value == "==" || t.value == "!=" || t.value == "<" || t.value == "<=" || t.value == ">" || t.value == ">=")) {
      ops.push_back(t.value);
      advance();
    } else if (is_name("in")) {
      ops.push_back("in");
      advance();
    } else if (is_name("not") && peek().kind == TokenKind::name && peek().value == "in") {
      ops.push_back("notin");
      advance();
      advance();
    } else {
      break;
    }
    rest.push_back(parse_math1());
  }
  if (ops.empty()) return first;
  auto c = make_expr(ExprKind::compare, at.line, at.column);
  c->children.push_back(std::move(first));
  for (auto& r : rest) c->children.push_back(std::move(r));
  c->ops = std::move(ops);
  return c;
}

ExprPtr Parser::parse_math1() {
  ExprPtr left = parse_concat();
  while (is_op("+") || is_op("-")) {
    const Token at = cur();
    advance();
    left = binary(at.value == "+" ? "+" : "-", std::move(left), parse_concat(), at);
  }
  return left;
}

ExprPtr Parser::parse_concat() {
  const Token at = cur();
  ExprPtr first = parse_math2();
  if (!is_op("~")) return first;
  auto c = make_expr(ExprKind::concat, at.line, at.column);
  c->children.push_back(std::move(first));
  while (skip_op("~")) c->children.push_back(parse_math2());
  return c;
}

ExprPtr Parser::parse_math2() {
  ExprPtr left = parse_pow();
  while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
    const Token at = cur();
    advance();
    const char* op = at.value == "*" ? "*" : at.value == "/" ? "/" : at.value == "//" ? "//" : "%";
    left = binary(op, std::move(left), parse_pow(), at);
  }
  return left;
}

ExprPtr Parser::parse_pow() {
  ExprPtr left = parse_unary(true);
  while (is_op("**")) {
    const Token at = cur();
    advance();
    left = binary("**", std::move(left), parse_unary(true), at);
  }
  return left;
}

ExprPtr Parser::parse_unary(bool with_filter) {
  DepthGuard guard(*this);
  const Token at = cur();
  ExprPtr node;
  if (is_op("-") || is_op("+")) {
    advance();
    node = make_expr(ExprKind::unary, at.line, at.column);
    node->name = at.value;
    node->children.push_back(parse_unary(false));
  } else {
    node = parse_primary();
  }
  node = parse_postfix(std::move(node));
  if (with_filter) node = parse_filter_expr(std::move(node));
  return node;
}

ExprPtr Parser::parse_primary() {
  DepthGuard guard(*this);
  const Token at = cur();
  switch (at.kind) {
    case TokenKind::name: {
      advance();
      auto e = make_expr(ExprKind::literal, at.line, at.column);
      if (at.value == "true" || at.value == "True") {
        e->literal = Value::boolean(true);
      } else if (at.value == "false" || at.value == "False") {
        e->literal = Value::boolean(false);
      } else if (at.value == "none" || at.value == "None") {
        e->literal = Value::none();
      } else {
        e->kind = ExprKind::name;
        e->name = at.value;
      }
      return e;
    }
    case TokenKind::string: {
      std::string s;
      while (cur().kind == TokenKind::string) {
        s += cur().value;
        advance();
      }
      auto e = make_expr(ExprKind::literal, at.line, at.column);
      e->literal = Value::string(std::move(s));
      return e;
    }
    case TokenKind::integer: {
      advance();
      auto e = make_expr(ExprKind::literal, at.line, at.column);
      e->literal = Value::integer(at.int_value);
      return e;
    }
    case TokenKind::floating: {
      advance();
      auto e = make_expr(ExprKind::literal, at.line, at.column);
      e->literal = Value::floating(at.float_value);
      return e;
    }
    case TokenKind::op:
      if (at.value == "(") {
        advance();
        ExprPtr e = parse_tuple(true, true);
        expect_op(")");
        return e;
      }
      if (at.value == "[") {
        advance();
        auto e = make_expr(ExprKind::list, at.line, at.column);
        while (!is_op("]")) {
          if (!e->children.empty()) expect_op(",");
          if (is_op("]")) break;
          e->children.push_back(parse_expression(true));
        }
        advance();
        return e;
      }
      if (at.value == "{") {
        advance();
        auto e = make_expr(ExprKind::dict, at.line, at.column);
        while (!is_op("}")) {
          if (!e->children.empty()) expect_op(",");
          if (is_op("}")) break;
          e->children.push_back(parse_expression(true));
          expect_op(":");
          e->children.push_back(parse_expression(true));
        }
        advance();
        return e;
      }
      break;
    default:
      break;
  }
  fail(at, "unexpected " + describe(at) + " in expression");
}

ExprPtr Parser::parse_postfix(ExprPtr node) {
  while (true) {
    if (is_op(".") || is_op("[")) {
      node = parse_subscript(std::move(node));
    } else if (is_op("(")) {
      node = parse_call(std::move(node));
    } else {
      return node;
    }
  }
}

ExprPtr Parser::parse_filter_expr(ExprPtr node) {
  while (true) {
    if (is_op("|")) {
      node = parse_filter(std::move(node));
    } else if (is_name("is")) {
      node = parse_test(std::move(node));
    } else if (is_op("(")) {
      node = parse_call(std::move(node));
    } else {
      return node;
    }
  }
}

ExprPtr Parser::parse_subscript(ExprPtr node) {
  DepthGuard guard(*this);
  const Token at = cur();
  advance();
  if (at.value == ".") {
    const Token t = cur();
    if (t.kind == TokenKind::name) {
      advance();
      auto g = make_expr(ExprKind::getattr, t.line, t.column);
      g->name = t.value;
      g->children.push_back(std::move(node));
      return g;
    }
    if (t.kind == TokenKind::integer) {
      advance();
      auto g = make_expr(ExprKind::getitem, t.line, t.column);
      auto k = make_expr(ExprKind::literal, t.line, t.column);
      k->literal = Value::integer(t.int_value);
      g->children.push_back(std::move(node));
      g->children.push_back(std::move(k));
      return g;
    }
    fail(t, "expected an attribute name after '.', got " + describe(t));
  }
  std::vector<ExprPtr> keys;
  while (!is_op("]")) {
    if (!keys.empty()) expect_op(",");
    if (is_op("]")) break;
    keys.push_back(parse_subscribed());
  }
  advance();
  if (keys.empty()) fail(at, "empty subscript '[]'");
  auto g = make_expr(ExprKind::getitem, at.line, at.column);
  g->children.push_back(std::move(node));
  if (keys.size() == 1) {
    g->children.push_back(std::move(keys[0]));
  } else {
    auto t = make_expr(ExprKind::tuple, at.line, at.column);
    t->children = std::move(keys);
    g->children.push_back(std::move(t));
  }
  return g;
}

ExprPtr Parser::parse_subscribed() {
  const Token at = cur();
  ExprPtr start;
  if (!is_op(":")) {
    start = parse_expression(true);
    if (!is_op(":")) return start;
  }
  advance();  // ':'
  auto s = make_expr(ExprKind::slice, at.line, at.column);
  ExprPtr stop;
  ExprPtr step;
  if (!is_op("]") && !is_op(",") && !is_op(":")) stop = parse_expression(true);
  if (skip_op(":")) {
    if (!is_op("]") && !is_op(",")) step = parse_expression(true);
  }
  s->children.push_back(std::move(start));
  s->children.push_back(std::move(stop));
  s->children.push_back(std::move(step));
  return s;
}

void Parser::parse_call_args(std::vector<Arg>& args) {
  expect_op("(");
  bool saw_kw = false;
  while (!is_op(")")) {
    if (!args.empty()) expect_op(",");
    if (is_op(")")) break;
    if (is_op("*") || is_op("**")) fail(cur(), "unsupported argument unpacking '" + cur().value + "'");
    Arg a;
    const Token at = cur();
    if (cur().kind == TokenKind::name && peek().kind == TokenKind::op && peek().value == "=") {
      a.name = cur().value;
      advance();
      advance();
      saw_kw = true;
    } else if (saw_kw) {
      fail(at, "positional argument follows keyword argument");
    }
    a.value = parse_expression(true);
    args.push_back(std::move(a));
  }
  advance();
}

ExprPtr Parser::parse_call(ExprPtr callee) {
  DepthGuard guard(*this);
  const Token at = cur();
  auto c = make_expr(ExprKind::call, at.line, at.column);
  c->children.push_back(std::move(callee));
  parse_call_args(c->args);
  return c;
}

ExprPtr Parser::parse_test(ExprPtr node) {
  DepthGuard guard(*this);
  advance();  // is
  const bool negated = skip_name("not");
  const Token nt = cur();
  auto t = make_expr(ExprKind::test, nt.line, nt.column);
  if (nt.kind == TokenKind::name) {
    t->name = nt.value;
    advance();
  } else if (nt.kind == TokenKind::op && (nt.value == "==" || nt.value == "!=" || nt.value == "<" ||
                                          nt.value == "<=" || nt.value == ">" || nt.value == ">=")) {
    t->name = nt.value;
    advance();
  } else {
    fail(nt, "expected a test name after 'is', got " + describe(nt));
  }
  t->negated = negated;
  t->children.push_back(std::move(node));
  const Token& c = cur();
  if (is_op("(")) {
    parse_call_args(t->args);
  } else if ((c.kind == TokenKind::name || c.kind == TokenKind::string || c.kind == TokenKind::integer ||
              c.kind == TokenKind::floating || is_op("[") || is_op("{")) &&
             !(is_name("else") || is_name("or") || is_name("and") || is_name("if") || is_name("is"))) {
    Arg a;
    a.value = parse_postfix(parse_primary());
    t->args.push_back(std::move(a));
  }
  return t;
}

}  // namespace servedeck::worker::tmpl::detail
