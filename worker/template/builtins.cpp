#include "worker/template/builtins.hpp"

#include <cstdint>
#include <ctime>
#include <utility>

#include "worker/template/chat_template.hpp"
#include "worker/template/ops.hpp"

namespace servedeck::worker::tmpl {

namespace {

// note: jinja2's sandbox refuses ranges longer than 100000 items (MAX_RANGE).
constexpr int64_t k_max_range = 100000;

}  // namespace

std::vector<std::pair<std::string, Value>> builtin_globals(std::function<void()> on_step,
                                                          std::function<void(const Value&)> on_namespace) {
  std::vector<std::pair<std::string, Value>> globals;
  globals.emplace_back("range", Value::function("range", [on_step](CallArgs& a) {
    if (!a.kwargs.empty() || a.positional.empty() || a.positional.size() > 3) throw EvalError("range expected 1 to 3 integer arguments");
    int64_t v[3] = {0, 0, 1};
    for (size_t i = 0; i < a.positional.size(); ++i) {
      const Value& x = a.positional[i];
      if (!x.is(Kind::integer) && !x.is(Kind::boolean)) {
        throw EvalError(std::string("'") + to_string(x.kind()) + "' object cannot be interpreted as an integer");
      }
      v[i] = x.is(Kind::boolean) ? (x.as_bool() ? 1 : 0) : x.as_int();
    }
    int64_t start = 0, stop = v[0], stepv = 1;
    if (a.positional.size() >= 2) {
      start = v[0];
      stop = v[1];
    }
    if (a.positional.size() == 3) stepv = v[2];
    if (stepv == 0) throw EvalError("range() arg 3 must not be zero");
    std::vector<Value> out;
    for (int64_t i = start; stepv > 0 ? i < stop : i > stop; i += stepv) {
      if (static_cast<int64_t>(out.size()) >= k_max_range) {
        throw EvalError("range too big, the sandbox refuses more than " + std::to_string(k_max_range) + " items");
      }
      out.push_back(Value::integer(i));
      on_step();
      if ((stepv > 0 && i > INT64_MAX - stepv) || (stepv < 0 && i < INT64_MIN - stepv)) break;
    }
    return Value::list(std::move(out));
  }));
  globals.emplace_back("namespace", Value::function("namespace", [on_namespace](CallArgs& a) {
    Value ns = Value::ns();
    on_namespace(ns);
    if (a.positional.size() > 1) throw EvalError("namespace expected at most 1 positional argument");
    if (!a.positional.empty()) {
      const Value& src = a.positional[0];
      if (src.is(Kind::dict)) {
        for (const auto& [k, v] : src.dict_data().items) ns.dict_data().set(k, v);
      } else {
        for (const auto& pair : iterate(src)) {
          const auto kv = iterate(pair);
          if (kv.size() != 2) throw EvalError("namespace: expected (key, value) pairs");
          ns.dict_data().set(kv[0], kv[1]);
        }
      }
    }
    for (const auto& [k, v] : a.kwargs) ns.dict_data().set(Value::string(k), v);
    return ns;
  }));
  globals.emplace_back("dict", Value::function("dict", [](CallArgs& a) {
    Value d = Value::dict();
    if (!a.positional.empty()) {
      if (a.positional.size() > 1 || !a.positional[0].is(Kind::dict)) throw EvalError("dict: expected a mapping or keyword arguments");
      for (const auto& [k, v] : a.positional[0].dict_data().items) d.dict_data().set(k, v);
    }
    for (const auto& [k, v] : a.kwargs) d.dict_data().set(Value::string(k), v);
    return d;
  }));
  globals.emplace_back("raise_exception", Value::function("raise_exception", [](CallArgs& a) -> Value {
    throw TemplateRaised(a.positional.empty() ? std::string() : to_str(a.positional[0]));
  }));
  globals.emplace_back("strftime_now", Value::function("strftime_now", [](CallArgs& a) {
    if (a.positional.empty() || !a.positional[0].is_string()) throw EvalError("strftime_now expects a format string");
    const std::time_t now = std::time(nullptr);
    std::tm tm{};
    localtime_r(&now, &tm);
    char buf[512];
    const size_t n = std::strftime(buf, sizeof buf, a.positional[0].str().c_str(), &tm);
    return Value::string(std::string(buf, n));
  }));
  return globals;
}

}  // namespace servedeck::worker::tmpl
