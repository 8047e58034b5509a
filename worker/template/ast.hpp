// Syntax tree of a parsed chat template. Every node carries the line and column (1-based) of
// its first token so render errors can name them.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "worker/template/value.hpp"

namespace servedeck::worker::tmpl {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

enum class ExprKind {
  literal,  // literal
  name,     // name
  list,     // children = items
  tuple,    // children = items
  dict,     // children = k0, v0, k1, v1, ...
  getattr,  // children = [object], name = attribute
  getitem,  // children = [object, key]
  slice,    // children = [start, stop, step], each may be null
  call,     // children = [callee], args
  filter,   // children = [operand], name = filter, args
  test,     // children = [operand], name = test, args, negated
  unary,    // children = [operand], name = "-", "+", "not"
  binary,   // children = [left, right], name = "+", "-", "*", "/", "//", "%", "**", "and", "or"
  compare,  // children = [first, operand...], ops = "==", "!=", "<", "<=", ">", ">=", "in", "notin"
  concat,   // children = operands of `~`
  cond,     // children = [test, then, else (may be null)]
};

/// A call argument: positional when `name` is empty.
struct Arg {
  std::string name;
  ExprPtr value;
};

struct Expr {
  ExprKind kind = ExprKind::literal;
  int line = 0;
  int column = 0;
  Value literal;
  std::string name;
  std::vector<ExprPtr> children;
  std::vector<std::string> ops;
  std::vector<Arg> args;
  bool negated = false;
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

/// A macro (or call-block caller) parameter with an optional default.
struct Param {
  std::string name;
  ExprPtr default_value;
};

enum class StmtKind {
  text,          // text
  output,        // expr
  if_,           // branches (test, body); else_body
  for_,          // target, expr = iterable, cond = filter (may be null), body, else_body
  set,           // target (name, tuple or getattr), expr
  set_block,     // target (name), body, expr = filter chain over the block name (may be null)
  macro,         // name, params, body
  call_block,    // expr = call, params = caller params, body
  filter_block,  // expr = filter chain over the block name, body
  break_,
  continue_,
};

struct Branch {
  ExprPtr test;
  Body body;
};

struct Stmt {
  StmtKind kind = StmtKind::text;
  int line = 0;
  int column = 0;
  std::string text;
  std::string name;
  ExprPtr expr;
  ExprPtr target;
  ExprPtr cond;
  std::vector<Branch> branches;
  Body body;
  Body else_body;
  std::vector<Param> params;
};

/// Name bound to the rendered body of a `{% filter %}` or filtered `{% set %}` block; not a
/// valid identifier, so templates cannot collide with it.
inline constexpr const char* k_block_name = "\x01block";

}  // namespace servedeck::worker::tmpl
