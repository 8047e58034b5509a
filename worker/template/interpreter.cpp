#include "worker/template/interpreter.hpp"

#include "worker/template/builtins.hpp"
#include "worker/template/filters.hpp"
#include "worker/template/ops.hpp"

namespace servedeck::worker::tmpl {

namespace {

struct Scope;
using ScopePtr = std::shared_ptr<Scope>;

struct Scope {
  ScopePtr parent;
  std::vector<std::pair<std::string, Value>> vars;

  const Value* find(const std::string& name) const {
    for (const Scope* s = this; s; s = s->parent.get()) {
      for (const auto& [k, v] : s->vars) {
        if (k == name) return &v;
      }
    }
    return nullptr;
  }
  void set(const std::string& name, Value v) {
    for (auto& [k, old] : vars) {
      if (k == name) {
        old = std::move(v);
        return;
      }
    }
    vars.emplace_back(name, std::move(v));
  }
};

ScopePtr child(const ScopePtr& parent) {
  auto s = std::make_shared<Scope>();
  s->parent = parent;
  return s;
}

enum class Flow { normal, break_, continue_ };

bool uses_name(const Expr* e, const std::string& name);
bool uses_name(const Body& body, const std::string& name);

bool uses_name(const Expr* e, const std::string& name) {
  if (!e) return false;
  if (e->kind == ExprKind::name && e->name == name) return true;
  for (const auto& c : e->children) {
    if (uses_name(c.get(), name)) return true;
  }
  for (const auto& a : e->args) {
    if (uses_name(a.value.get(), name)) return true;
  }
  return false;
}

bool uses_name(const Body& body, const std::string& name) {
  for (const auto& s : body) {
    if (uses_name(s->expr.get(), name) || uses_name(s->cond.get(), name) || uses_name(s->body, name) ||
        uses_name(s->else_body, name)) {
      return true;
    }
    for (const auto& b : s->branches) {
      if (uses_name(b.test.get(), name) || uses_name(b.body, name)) return true;
    }
    for (const auto& p : s->params) {
      if (uses_name(p.default_value.get(), name)) return true;
    }
  }
  return false;
}

class Renderer {
 public:
  explicit Renderer(const RenderLimits& limits) : limits_(limits) {}

  ~Renderer() {
    // Break reference cycles (a list appended into itself, a macro stored in the scope it
    // captured) so that everything a render allocated is freed.
    for (auto& s : captured_) s->vars.clear();
    for (auto& v : mutated_) {
      if (v.is(Kind::list)) v.items().clear();
      if (v.has_attrs()) v.dict_data().items.clear();
    }
  }
  Renderer(const Renderer&) = delete;
  Renderer& operator=(const Renderer&) = delete;

  std::string run(const Body& program, const nlohmann::ordered_json& context) {
    set_max_string_bytes(limits_.max_string_bytes);
    auto root = std::make_shared<Scope>();
    install_builtins(*root);
    if (context.is_object()) {
      try {
        for (const auto& [k, v] : context.items()) root->set(k, from_json(v));
      } catch (const EvalError& e) {
        throw TemplateError(std::string("render context: ") + e.what(), 0, 0);
      }
    }
    auto top = child(root);
    captured_.push_back(root);
    captured_.push_back(top);
    std::string out;
    if (exec_body(program, top, out) != Flow::normal) throw TemplateError("'break' or 'continue' outside a loop", 1, 1);
    return out;
  }

 private:
  const RenderLimits& limits_;
  uint64_t steps_ = 0;
  int call_depth_ = 0;
  std::vector<ScopePtr> captured_;
  std::vector<Value> mutated_;

  void step() {
    if (++steps_ > limits_.max_steps) {
      throw EvalError("render exceeded " + std::to_string(limits_.max_steps) + " evaluation steps");
    }
  }

  void install_builtins(Scope& s) {
    for (auto& [name, fn] : builtin_globals([this] { step(); }, [this](const Value& ns) { mutated_.push_back(ns); }))
      s.set(name, std::move(fn));
  }

  // ---- statements ----

  Flow exec_body(const Body& body, const ScopePtr& scope, std::string& out) {
    for (const auto& s : body) {
      const Flow f = exec(*s, scope, out);
      if (f != Flow::normal) return f;
    }
    return Flow::normal;
  }

  void append(std::string& out, std::string_view text) {
    if (out.size() + text.size() > limits_.max_string_bytes) {
      throw EvalError("output exceeds the limit of " + std::to_string(limits_.max_string_bytes) + " bytes");
    }
    out.append(text);
  }

  Flow exec(const Stmt& s, const ScopePtr& scope, std::string& out) {
    try {
      step();
      switch (s.kind) {
        case StmtKind::text: append(out, s.text); return Flow::normal;
        case StmtKind::output: {
          const Value v = eval(*s.expr, scope);
          if (v.is_string()) append(out, v.str());
          else append(out, to_str(v));
          return Flow::normal;
        }
        case StmtKind::if_:
          for (const auto& br : s.branches) {
            if (eval(*br.test, scope).truthy()) return exec_body(br.body, scope, out);
          }
          return exec_body(s.else_body, scope, out);
        case StmtKind::for_: exec_for(s, scope, out); return Flow::normal;
        case StmtKind::set: assign(*s.target, eval(*s.expr, scope), scope); return Flow::normal;
        case StmtKind::set_block: {
          std::string body;
          auto inner = child(scope);
          if (exec_body(s.body, inner, body) != Flow::normal) throw EvalError("'break' or 'continue' outside a loop");
          Value v = Value::string(std::move(body));
          if (s.expr) v = apply_block_filter(*s.expr, v, scope);
          assign(*s.target, v, scope);
          return Flow::normal;
        }
        case StmtKind::macro: scope->set(s.name, make_macro(s, scope)); return Flow::normal;
        case StmtKind::call_block: {
          const Value v = eval_call(*s.expr, scope, make_caller(s, scope));
          append(out, to_str(v));
          return Flow::normal;
        }
        case StmtKind::filter_block: {
          std::string body;
          if (exec_body(s.body, scope, body) != Flow::normal) throw EvalError("'break' or 'continue' inside a filter block");
          append(out, to_str(apply_block_filter(*s.expr, Value::string(std::move(body)), scope)));
          return Flow::normal;
        }
        case StmtKind::break_: return Flow::break_;
        case StmtKind::continue_: return Flow::continue_;
      }
    } catch (const EvalError& e) {
      throw TemplateError(e.what(), s.line, s.column);
    }
    return Flow::normal;
  }

  Value apply_block_filter(const Expr& filter_chain, Value body, const ScopePtr& scope) {
    auto inner = child(scope);
    inner->set(k_block_name, std::move(body));
    return eval(filter_chain, inner);
  }

  void assign(const Expr& target, const Value& v, const ScopePtr& scope) {
    if (target.kind == ExprKind::name) {
      scope->set(target.name, v);
    } else if (target.kind == ExprKind::tuple) {
      const auto items = iterate(v);
      if (items.size() != target.children.size()) {
        throw EvalError(std::string(items.size() > target.children.size() ? "too many" : "not enough") +
                        " values to unpack (expected " + std::to_string(target.children.size()) + ", got " +
                        std::to_string(items.size()) + ")");
      }
      for (size_t i = 0; i < items.size(); ++i) scope->set(target.children[i]->name, items[i]);
    } else if (target.kind == ExprKind::getattr) {
      const Value obj = eval(*target.children[0], scope);
      if (!obj.is(Kind::ns)) throw EvalError("cannot assign attribute on non-namespace object");
      obj.dict_data().set(Value::string(target.name), v);
    } else {
      throw EvalError("cannot assign to this target");
    }
  }

  void exec_for(const Stmt& s, const ScopePtr& scope, std::string& out) {
    std::vector<Value> items = iterate(eval(*s.expr, scope));
    if (s.cond) {
      std::vector<Value> kept;
      for (auto& item : items) {
        auto probe = child(scope);
        assign(*s.target, item, probe);
        if (eval(*s.cond, probe).truthy()) kept.push_back(std::move(item));
      }
      items = std::move(kept);
    }
    if (items.empty()) {
      if (exec_body(s.else_body, scope, out) != Flow::normal) throw EvalError("'break' or 'continue' outside a loop");
      return;
    }
    const auto n = static_cast<int64_t>(items.size());
    for (int64_t i = 0; i < n; ++i) {
      step();
      auto iter = child(scope);
      Value loop = Value::object();
      auto& d = loop.dict_data();
      d.set(Value::string("index"), Value::integer(i + 1));
      d.set(Value::string("index0"), Value::integer(i));
      d.set(Value::string("revindex"), Value::integer(n - i));
      d.set(Value::string("revindex0"), Value::integer(n - i - 1));
      d.set(Value::string("first"), Value::boolean(i == 0));
      d.set(Value::string("last"), Value::boolean(i == n - 1));
      d.set(Value::string("length"), Value::integer(n));
      d.set(Value::string("depth"), Value::integer(1));
      d.set(Value::string("depth0"), Value::integer(0));
      d.set(Value::string("previtem"), i > 0 ? items[static_cast<size_t>(i - 1)] : Value::undefined("there is no previous item"));
      d.set(Value::string("nextitem"), i + 1 < n ? items[static_cast<size_t>(i + 1)] : Value::undefined("there is no next item"));
      d.set(Value::string("cycle"), Value::function("cycle", [i](CallArgs& a) {
        if (a.positional.empty()) throw EvalError("no items for cycling given");
        return a.positional[static_cast<size_t>(i) % a.positional.size()];
      }));
      iter->set("loop", std::move(loop));
      assign(*s.target, items[static_cast<size_t>(i)], iter);
      if (exec_body(s.body, iter, out) == Flow::break_) break;
    }
  }

  Value make_macro(const Stmt& s, const ScopePtr& scope) {
    captured_.push_back(scope);
    const bool wants_varargs = uses_name(s.body, "varargs");
    const bool wants_kwargs = uses_name(s.body, "kwargs");
    const Stmt* def = &s;
    return Value::function(s.name, [this, def, scope, wants_varargs, wants_kwargs](CallArgs& a) {
      return call_body(def->name, def->params, def->body, scope, a, wants_varargs, wants_kwargs);
    });
  }

  Value make_caller(const Stmt& s, const ScopePtr& scope) {
    captured_.push_back(scope);
    const Stmt* def = &s;
    return Value::function("caller", [this, def, scope](CallArgs& a) {
      return call_body("caller", def->params, def->body, scope, a, false, false);
    });
  }

  Value call_body(const std::string& name, const std::vector<Param>& params, const Body& body, const ScopePtr& closure,
                  CallArgs& a, bool wants_varargs, bool wants_kwargs) {
    if (call_depth_ >= limits_.max_call_depth) {
      throw EvalError("macro calls nested deeper than " + std::to_string(limits_.max_call_depth));
    }
    struct DepthGuard {
      int& d;
      explicit DepthGuard(int& depth) : d(depth) { ++d; }
      ~DepthGuard() { --d; }
      DepthGuard(const DepthGuard&) = delete;
      DepthGuard& operator=(const DepthGuard&) = delete;
    } guard(call_depth_);
    auto scope = child(closure);
    std::vector<bool> bound(params.size(), false);
    for (size_t i = 0; i < a.positional.size() && i < params.size(); ++i) {
      scope->set(params[i].name, a.positional[i]);
      bound[i] = true;
    }
    Value extra_kwargs = Value::dict();
    for (const auto& [k, v] : a.kwargs) {
      if (k == "caller") {
        scope->set("caller", v);
        continue;
      }
      bool matched = false;
      for (size_t i = 0; i < params.size(); ++i) {
        if (params[i].name != k) continue;
        if (bound[i]) throw EvalError("macro '" + name + "' got multiple values for argument '" + k + "'");
        scope->set(k, v);
        bound[i] = true;
        matched = true;
      }
      if (!matched) {
        if (!wants_kwargs) throw EvalError("macro '" + name + "' takes no keyword argument '" + k + "'");
        extra_kwargs.dict_data().set(Value::string(k), v);
      }
    }
    if (a.positional.size() > params.size() && !wants_varargs) {
      throw EvalError("macro '" + name + "' takes not more than " + std::to_string(params.size()) + " argument(s)");
    }
    std::vector<Value> varargs;
    for (size_t i = params.size(); i < a.positional.size(); ++i) varargs.push_back(a.positional[i]);
    if (wants_varargs) scope->set("varargs", Value::list(std::move(varargs), true));
    if (wants_kwargs) scope->set("kwargs", extra_kwargs);
    for (size_t i = 0; i < params.size(); ++i) {
      if (bound[i]) continue;
      scope->set(params[i].name, params[i].default_value ? eval(*params[i].default_value, scope)
                                                         : Value::undefined("parameter '" + params[i].name + "' was not provided"));
    }
    std::string out;
    if (exec_body(body, scope, out) != Flow::normal) throw EvalError("'break' or 'continue' outside a loop");
    return Value::string(std::move(out));
  }

  // ---- expressions ----

  CallArgs eval_args(const std::vector<Arg>& args, const ScopePtr& scope) {
    CallArgs out;
    for (const auto& a : args) {
      if (a.name.empty()) out.positional.push_back(eval(*a.value, scope));
      else out.kwargs.emplace_back(a.name, eval(*a.value, scope));
    }
    return out;
  }

  Value eval_call(const Expr& e, const ScopePtr& scope, const Value& caller = Value()) {
    const Value callee = eval(*e.children[0], scope);
    CallArgs args = eval_args(e.args, scope);
    if (callee.is(Kind::function)) {
      if (!caller.is_undefined()) args.kwargs.emplace_back("caller", caller);
      if (callee.fn().name == "append" && !e.children.empty() && e.children[0]->kind == ExprKind::getattr) {
        const Value target = eval(*e.children[0]->children[0], scope);
        if (target.is(Kind::list)) mutated_.push_back(target);
      }
      return callee.fn().call(args);
    }
    if (callee.is_undefined()) fail_undefined(callee);
    throw EvalError(std::string("'") + to_string(callee.kind()) + "' object is not callable");
  }

  static std::optional<int64_t> slice_bound(const Value& v) {
    if (v.is_none() || v.is_undefined()) return std::nullopt;
    if (v.is(Kind::integer)) return v.as_int();
    if (v.is(Kind::boolean)) return v.as_bool() ? 1 : 0;
    throw EvalError("slice indices must be integers or None");
  }

  Value eval(const Expr& e, const ScopePtr& scope) {
    try {
      step();
      return eval_inner(e, scope);
    } catch (const EvalError& err) {
      throw TemplateError(err.what(), e.line, e.column);
    }
  }

  Value eval_inner(const Expr& e, const ScopePtr& scope) {
    switch (e.kind) {
      case ExprKind::literal: return e.literal;
      case ExprKind::name: {
        if (const Value* v = scope->find(e.name)) return *v;
        return Value::undefined("'" + e.name + "' is undefined");
      }
      case ExprKind::list:
      case ExprKind::tuple: {
        std::vector<Value> items;
        for (const auto& c : e.children) items.push_back(eval(*c, scope));
        return Value::list(std::move(items), e.kind == ExprKind::tuple);
      }
      case ExprKind::dict: {
        Value d = Value::dict();
        for (size_t i = 0; i + 1 < e.children.size(); i += 2) {
          const Value k = eval(*e.children[i], scope);
          if (k.is(Kind::list) && !k.list_data().is_tuple) throw EvalError("unhashable type: 'list'");
          if (k.is(Kind::dict) || k.is_undefined()) throw EvalError(std::string("unhashable type: '") + to_string(k.kind()) + "'");
          d.dict_data().set(k, eval(*e.children[i + 1], scope));
        }
        return d;
      }
      case ExprKind::getattr: return get_attr(eval(*e.children[0], scope), e.name);
      case ExprKind::getitem: {
        const Value obj = eval(*e.children[0], scope);
        const Expr& key = *e.children[1];
        if (key.kind == ExprKind::slice) {
          auto part = [&](size_t i) { return key.children[i] ? slice_bound(eval(*key.children[i], scope)) : std::nullopt; };
          return slice_value(obj, part(0), part(1), part(2));
        }
        return get_item(obj, eval(key, scope));
      }
      case ExprKind::slice: throw EvalError("slice outside a subscript");
      case ExprKind::call: return eval_call(e, scope);
      case ExprKind::filter: {
        const Value operand = eval(*e.children[0], scope);
        return apply_filter(e.name, operand, eval_args(e.args, scope));
      }
      case ExprKind::test: {
        const Value operand = eval(*e.children[0], scope);
        const bool r = apply_test(e.name, operand, eval_args(e.args, scope));
        return Value::boolean(e.negated ? !r : r);
      }
      case ExprKind::unary: {
        const Value v = eval(*e.children[0], scope);
        if (e.name == "not") return Value::boolean(!v.truthy());
        if (v.is_undefined()) fail_undefined(v);
        if (!v.is_number()) throw EvalError("bad operand type for unary " + e.name + ": '" + to_string(v.kind()) + "'");
        if (e.name == "+") return v.is(Kind::boolean) ? Value::integer(v.as_bool() ? 1 : 0) : v;
        if (v.is(Kind::floating)) return Value::floating(-v.as_float());
        return arithmetic("-", Value::integer(0), v);
      }
      case ExprKind::binary: {
        const Value l = eval(*e.children[0], scope);
        if (e.name == "and") return l.truthy() ? eval(*e.children[1], scope) : l;
        if (e.name == "or") return l.truthy() ? l : eval(*e.children[1], scope);
        return arithmetic(e.name, l, eval(*e.children[1], scope));
      }
      case ExprKind::compare: {
        Value left = eval(*e.children[0], scope);
        for (size_t i = 0; i < e.ops.size(); ++i) {
          Value right = eval(*e.children[i + 1], scope);
          const std::string& op = e.ops[i];
          bool ok = false;
          if (op == "==") ok = equals(left, right);
          else if (op == "!=") ok = !equals(left, right);
          else if (op == "in") ok = contains(right, left);
          else if (op == "notin") ok = !contains(right, left);
          else {
            const int c = compare(left, right);
            ok = op == "<" ? c < 0 : op == "<=" ? c <= 0 : op == ">" ? c > 0 : c >= 0;
          }
          if (!ok) return Value::boolean(false);
          left = std::move(right);
        }
        return Value::boolean(true);
      }
      case ExprKind::concat: {
        std::string out;
        for (const auto& c : e.children) {
          out += to_str(eval(*c, scope));
          check_string_size(out.size());
        }
        return Value::string(std::move(out));
      }
      case ExprKind::cond: {
        if (eval(*e.children[0], scope).truthy()) return eval(*e.children[1], scope);
        if (e.children[2]) return eval(*e.children[2], scope);
        return Value::undefined("the inline if-expression evaluated to false and no else section was defined");
      }
    }
    throw EvalError("unknown expression");
  }
};

void validate_expr(const Expr* e) {
  if (!e) return;
  if (e->kind == ExprKind::filter && !is_known_filter(e->name)) {
    throw TemplateError("unsupported filter '" + e->name + "'", e->line, e->column);
  }
  if (e->kind == ExprKind::test && !is_known_test(e->name)) {
    throw TemplateError("unsupported test '" + e->name + "'", e->line, e->column);
  }
  for (const auto& c : e->children) validate_expr(c.get());
  for (const auto& a : e->args) validate_expr(a.value.get());
}

}  // namespace

void validate_program(const Body& program) {
  for (const auto& s : program) {
    validate_expr(s->expr.get());
    validate_expr(s->target.get());
    validate_expr(s->cond.get());
    for (const auto& b : s->branches) {
      validate_expr(b.test.get());
      validate_program(b.body);
    }
    for (const auto& p : s->params) validate_expr(p.default_value.get());
    validate_program(s->body);
    validate_program(s->else_body);
  }
}

std::string render_program(const Body& program, const nlohmann::ordered_json& context, const RenderLimits& limits) {
  Renderer r(limits);
  return r.run(program, context);
}

}  // namespace servedeck::worker::tmpl
