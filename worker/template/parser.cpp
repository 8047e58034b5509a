#include "worker/template/parser.hpp"

#include <algorithm>
#include <initializer_list>

#include "worker/template/chat_template.hpp"
#include "worker/template/lexer.hpp"

namespace servedeck::worker::tmpl {

namespace {

// note: real templates nest < 15 levels; 256 keeps recursion well inside an 8 MiB stack
// even under ASan.
constexpr int k_max_nesting = 256;

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : tokens_(std::move(tokens)) {}

  Body parse_all() {
    Body body;
    std::string end;
    parse_body(body, {}, end);
    return body;
  }

 private:
  std::vector<Token> tokens_;
  size_t pos_ = 0;
  int depth_ = 0;

  struct DepthGuard {
    Parser& p;
    explicit DepthGuard(Parser& parser) : p(parser) {
      if (++p.depth_ > k_max_nesting) p.fail(p.cur(), "nesting deeper than " + std::to_string(k_max_nesting) + " levels");
    }
    ~DepthGuard() { --p.depth_; }
    DepthGuard(const DepthGuard&) = delete;
    DepthGuard& operator=(const DepthGuard&) = delete;
  };

  const Token& cur() const { return tokens_[pos_]; }
  const Token& peek(size_t k = 1) const { return tokens_[std::min(pos_ + k, tokens_.size() - 1)]; }
  void advance() {
    if (pos_ + 1 < tokens_.size()) ++pos_;
  }

  [[noreturn]] void fail(const Token& t, const std::string& msg) const { throw TemplateError(msg, t.line, t.column); }

  static std::string describe(const Token& t) {
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

  bool is_op(std::string_view op) const { return cur().kind == TokenKind::op && cur().value == op; }
  bool is_name(std::string_view name) const { return cur().kind == TokenKind::name && cur().value == name; }
  bool skip_op(std::string_view op) {
    if (!is_op(op)) return false;
    advance();
    return true;
  }
  bool skip_name(std::string_view name) {
    if (!is_name(name)) return false;
    advance();
    return true;
  }
  void expect_op(std::string_view op) {
    if (!skip_op(op)) fail(cur(), "expected '" + std::string(op) + "', got " + describe(cur()));
  }
  void expect_block_end() {
    if (cur().kind != TokenKind::block_end) fail(cur(), "expected '%}', got " + describe(cur()));
    advance();
  }
  std::string expect_name() {
    if (cur().kind != TokenKind::name) fail(cur(), "expected a name, got " + describe(cur()));
    std::string v = cur().value;
    advance();
    return v;
  }

  template <class Node>
  static std::unique_ptr<Node> make(const Token& at) {
    auto n = std::make_unique<Node>();
    n->line = at.line;
    n->column = at.column;
    return n;
  }

  static ExprPtr make_expr(ExprKind kind, int line, int column) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = line;
    e->column = column;
    return e;
  }

  // Parses statements until `{% <one of ends> %}`; leaves the parser after the end name
  // (the caller parses the rest of that tag) and stores the end name in `found`.
  void parse_body(Body& body, std::initializer_list<std::string_view> ends, std::string& found) {
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

  void parse_statement(Body& body) {
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

  StmtPtr parse_if() {
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
  ExprPtr parse_target(bool allow_attr, std::string_view end_name) {
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

  StmtPtr parse_for() {
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

  StmtPtr parse_set() {
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

  ExprPtr block_placeholder(const Token& at) {
    auto e = make_expr(ExprKind::name, at.line, at.column);
    e->name = k_block_name;
    return e;
  }

  void parse_params(std::vector<Param>& params) {
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

  StmtPtr parse_macro() {
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

  StmtPtr parse_call_block() {
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

  StmtPtr parse_filter_block() {
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

  ExprPtr parse_filters(ExprPtr node) {
    while (is_op("|")) node = parse_filter(std::move(node));
    return node;
  }

  // Current token is `|` or the `filter` keyword; parses name and optional arguments.
  ExprPtr parse_filter(ExprPtr operand) {
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

  // ---- expressions ----

  // parse_tuple: comma-separated expressions; a single one without comma is itself.
  ExprPtr parse_tuple(bool with_condexpr, bool explicit_paren = false) {
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

  ExprPtr parse_expression(bool with_condexpr) {
    DepthGuard guard(*this);
    return with_condexpr ? parse_condexpr() : parse_or();
  }

  ExprPtr parse_condexpr() {
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

  ExprPtr binary(const char* op, ExprPtr l, ExprPtr r, const Token& at) {
    auto b = make_expr(ExprKind::binary, at.line, at.column);
    b->name = op;
    b->children.push_back(std::move(l));
    b->children.push_back(std::move(r));
    return b;
  }

  ExprPtr parse_or() {
    ExprPtr left = parse_and();
    while (is_name("or")) {
      const Token at = cur();
      advance();
      left = binary("or", std::move(left), parse_and(), at);
    }
    return left;
  }

  ExprPtr parse_and() {
    ExprPtr left = parse_not();
    while (is_name("and")) {
      const Token at = cur();
      advance();
      left = binary("and", std::move(left), parse_not(), at);
    }
    return left;
  }

  ExprPtr parse_not() {
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

  ExprPtr parse_compare() {
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

  ExprPtr parse_math1() {
    ExprPtr left = parse_concat();
    while (is_op("+") || is_op("-")) {
      const Token at = cur();
      advance();
      left = binary(at.value == "+" ? "+" : "-", std::move(left), parse_concat(), at);
    }
    return left;
  }

  ExprPtr parse_concat() {
    const Token at = cur();
    ExprPtr first = parse_math2();
    if (!is_op("~")) return first;
    auto c = make_expr(ExprKind::concat, at.line, at.column);
    c->children.push_back(std::move(first));
    while (skip_op("~")) c->children.push_back(parse_math2());
    return c;
  }

  ExprPtr parse_math2() {
    ExprPtr left = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const Token at = cur();
      advance();
      const char* op = at.value == "*" ? "*" : at.value == "/" ? "/" : at.value == "//" ? "//" : "%";
      left = binary(op, std::move(left), parse_pow(), at);
    }
    return left;
  }

  ExprPtr parse_pow() {
    ExprPtr left = parse_unary(true);
    while (is_op("**")) {
      const Token at = cur();
      advance();
      left = binary("**", std::move(left), parse_unary(true), at);
    }
    return left;
  }

  ExprPtr parse_unary(bool with_filter) {
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

  ExprPtr parse_primary() {
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

  ExprPtr parse_postfix(ExprPtr node) {
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

  ExprPtr parse_filter_expr(ExprPtr node) {
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

  ExprPtr parse_subscript(ExprPtr node) {
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

  ExprPtr parse_subscribed() {
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

  void parse_call_args(std::vector<Arg>& args) {
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

  ExprPtr parse_call(ExprPtr callee) {
    DepthGuard guard(*this);
    const Token at = cur();
    auto c = make_expr(ExprKind::call, at.line, at.column);
    c->children.push_back(std::move(callee));
    parse_call_args(c->args);
    return c;
  }

  ExprPtr parse_test(ExprPtr node) {
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
};

}  // namespace

Body parse_template(std::string_view source) { return Parser(lex(source)).parse_all(); }

}  // namespace servedeck::worker::tmpl
