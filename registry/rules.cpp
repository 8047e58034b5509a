#include "registry/rules.hpp"

#include "common/json_limits.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "registry/toml_reader.hpp"

namespace servedeck::registry {

namespace {

using nlohmann::json;

std::string scalar_text(const json& j) {
  if (j.is_string()) return j.get<std::string>();
  if (j.is_boolean()) return j.get<bool>() ? "true" : "false";
  if (j.is_number_integer()) return std::to_string(j.get<int64_t>());
  if (j.is_number()) return detail::format_number(j.get<double>());
  return dump_safe(j);
}

std::optional<double> to_number(const std::string& s) {
  if (s.empty()) return std::nullopt;
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  if (end != s.c_str() + s.size() || !std::isfinite(v)) return std::nullopt;
  return v;
}

const std::vector<std::string> kMatchKeys = {"engine", "model", "gpu_cc", "env", "arg", "field", "any", "all", "not"};
const std::vector<std::string> kCondKeys = {"present", "absent", "equals", "not_equals", "in", "not_in",
                                            "contains", "not_contains", "eq", "ne", "lt", "le", "gt", "ge",
                                            "json", "raw"};
const std::vector<std::string> kNumericOps = {"eq", "ne", "lt", "le", "gt", "ge"};

std::string op_symbol(const std::string& op) {
  if (op == "eq") return "==";
  if (op == "ne") return "!=";
  if (op == "lt") return "<";
  if (op == "le") return "<=";
  if (op == "gt") return ">";
  return ">=";
}

struct Outcome {
  bool matched = false;
  std::vector<std::string> evidence;
  bool cc_assumed = false;
};

json normalise_cond(const json& c) {
  if (c.is_object()) return c;
  if (c.is_array()) return json{{"in", c}};
  if (c.is_number()) return json{{"eq", c}};
  return json{{"equals", scalar_text(c)}};
}

/// Takes member `path` (dotted) of the JSON text `value`.
std::optional<std::string> json_member(const std::string& value, const std::string& path) {
  json doc = parse_untrusted(value);
  if (doc.is_discarded()) return std::nullopt;
  const json* cur = &doc;
  std::size_t start = 0;
  while (start <= path.size()) {
    std::size_t dot = path.find('.', start);
    std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    if (!cur->is_object() || !cur->contains(part)) return std::nullopt;
    cur = &(*cur)[part];
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  return scalar_text(*cur);
}

/// Evaluates `cond` against `value` (nullopt = absent); `label` names what was read.
Outcome eval_cond(std::optional<std::string> value, const json& cond_in, std::string label, const ModelEntry& m) {
  json cond = normalise_cond(cond_in);
  Outcome out;
  if (cond.contains("json") && value) {
    std::string path = cond["json"].get<std::string>();
    value = json_member(*value, path);
    label += " " + path;
  } else if (cond.contains("json")) {
    label += " " + cond["json"].get<std::string>();
  }
  const std::string shown = value ? label + " = " + (value->empty() ? std::string("(set)") : *value) : label + " absent";
  std::vector<std::string> why;
  for (auto it = cond.begin(); it != cond.end(); ++it) {
    const std::string& op = it.key();
    const json& arg = it.value();
    if (op == "json" || op == "raw") continue;
    bool ok = false;
    if (op == "present") {
      ok = value.has_value() == arg.get<bool>();
    } else if (op == "absent") {
      ok = !value.has_value() == arg.get<bool>();
    } else if (op == "equals") {
      ok = value && *value == scalar_text(arg);
    } else if (op == "not_equals") {
      ok = !value || *value != scalar_text(arg);
      if (ok && value) why.push_back("not " + scalar_text(arg));
    } else if (op == "in" || op == "not_in") {
      bool found = false;
      for (const auto& e : arg)
        if (value && *value == scalar_text(e)) found = true;
      ok = op == "in" ? found : !found;
    } else if (op == "contains") {
      ok = value && value->find(arg.get<std::string>()) != std::string::npos;
    } else if (op == "not_contains") {
      ok = !value || value->find(arg.get<std::string>()) == std::string::npos;
      if (ok && value) why.push_back("lacks " + arg.get<std::string>());
    } else {  // numeric
      std::optional<double> lhs = value ? to_number(*value) : std::nullopt;
      std::optional<double> rhs;
      std::string rhs_text;
      if (arg.is_number()) {
        rhs = arg.get<double>();
        rhs_text = detail::format_number(*rhs);
      } else {
        std::string f = arg.get<std::string>();
        if (auto fv = field_value(m, f)) {
          rhs = to_number(*fv);
          rhs_text = f + " " + *fv;
        }
      }
      if (lhs && rhs) {
        if (op == "eq") ok = *lhs == *rhs;
        else if (op == "ne") ok = *lhs != *rhs;
        else if (op == "lt") ok = *lhs < *rhs;
        else if (op == "le") ok = *lhs <= *rhs;
        else if (op == "gt") ok = *lhs > *rhs;
        else if (op == "ge") ok = *lhs >= *rhs;
      }
      if (ok) why.push_back(op_symbol(op) + " " + rhs_text);
    }
    if (!ok) return out;
  }
  out.matched = true;
  out.evidence.push_back(why.empty() ? shown : shown + " (" + [&] {
    std::string s;
    for (const auto& w : why) s += (s.empty() ? "" : ", ") + w;
    return s;
  }() + ")");
  return out;
}

bool name_in(const json& spec, const std::string& name) {
  if (spec.is_string()) return spec.get<std::string>() == name;
  for (const auto& e : spec)
    if (e.is_string() && e.get<std::string>() == name) return true;
  return false;
}

Outcome eval_match(const json& match, const RuleSubject& s) {
  Outcome out;
  const ModelEntry& m = *s.model;
  for (auto it = match.begin(); it != match.end(); ++it) {
    const std::string& key = it.key();
    const json& spec = it.value();
    Outcome part;
    if (key == "engine") {
      part.matched = name_in(spec, std::string(to_string(m.engine)));
    } else if (key == "model") {
      part.matched = name_in(spec, m.name);
    } else if (key == "gpu_cc") {
      if (!s.gpu_cc) {
        part.matched = true;
        part.cc_assumed = true;
        json c = normalise_cond(spec);
        part.evidence.push_back("GPU compute capability unknown (rule applies to " +
                                (c.contains("in") ? dump_safe(c["in"]) : dump_safe(c)) + ")");
      } else {
        part = eval_cond(std::to_string(*s.gpu_cc), spec, "GPU compute capability", m);
      }
    } else if (key == "env" || key == "arg" || key == "field") {
      part.matched = true;
      for (auto e = spec.begin(); e != spec.end(); ++e) {
        json cond = normalise_cond(e.value());
        bool raw = cond.value("raw", false);
        std::optional<std::string> value;
        std::string label;
        if (key == "env") {
          const auto& env = raw ? s.raw_env : s.env;
          auto f = env.find(e.key());
          if (f != env.end()) value = f->second;
          label = "env " + e.key();
        } else if (key == "arg") {
          value = arg_value(raw ? s.raw_args : s.args, e.key());
          label = "argv " + e.key();
        } else {
          value = field_value(m, e.key());
          label = e.key();
        }
        Outcome c = eval_cond(value, cond, label, m);
        if (!c.matched) {
          part.matched = false;
          break;
        }
        part.evidence.insert(part.evidence.end(), c.evidence.begin(), c.evidence.end());
      }
    } else if (key == "any") {
      for (const auto& sub : spec) {
        Outcome c = eval_match(sub, s);
        if (c.matched) {
          part = c;
          break;
        }
      }
    } else if (key == "all") {
      part.matched = true;
      for (const auto& sub : spec) {
        Outcome c = eval_match(sub, s);
        if (!c.matched) {
          part.matched = false;
          break;
        }
        part.evidence.insert(part.evidence.end(), c.evidence.begin(), c.evidence.end());
        part.cc_assumed = part.cc_assumed || c.cc_assumed;
      }
    } else if (key == "not") {
      Outcome c = eval_match(spec, s);
      part.matched = !c.matched;
    }
    if (!part.matched) return Outcome{};
    out.evidence.insert(out.evidence.end(), part.evidence.begin(), part.evidence.end());
    out.cc_assumed = out.cc_assumed || part.cc_assumed;
  }
  out.matched = true;
  return out;
}

void validate_cond(const json& c, const std::string& ptr, std::vector<std::pair<std::string, std::string>>& errs) {
  if (!c.is_object()) {
    if (c.is_array()) {
      for (const auto& e : c)
        if (!e.is_string() && !e.is_number() && !e.is_boolean())
          errs.emplace_back(ptr, "array elements must be strings, numbers or booleans");
    } else if (!c.is_string() && !c.is_number() && !c.is_boolean()) {
      errs.emplace_back(ptr, "a condition is a string, number, boolean, array or table of operators");
    }
    return;
  }
  for (auto it = c.begin(); it != c.end(); ++it) {
    const std::string& op = it.key();
    const json& v = it.value();
    std::string p = ptr + "/" + op;
    if (std::find(kCondKeys.begin(), kCondKeys.end(), op) == kCondKeys.end()) {
      std::string hint = detail::closest_key(op, kCondKeys);
      errs.emplace_back(p, "unknown operator '" + op + "'" + (hint.empty() ? "" : "; did you mean '" + hint + "'?") +
                               " (valid: present absent equals not_equals in not_in contains not_contains eq ne "
                               "lt le gt ge json raw)");
    } else if (op == "present" || op == "absent" || op == "raw") {
      if (!v.is_boolean()) errs.emplace_back(p, "'" + op + "' takes true or false");
    } else if (op == "in" || op == "not_in") {
      if (!v.is_array()) errs.emplace_back(p, "'" + op + "' takes an array");
    } else if (op == "contains" || op == "not_contains" || op == "json") {
      if (!v.is_string()) errs.emplace_back(p, "'" + op + "' takes a string");
    } else if (op == "equals" || op == "not_equals") {
      if (v.is_object() || v.is_array()) errs.emplace_back(p, "'" + op + "' takes a string");
    } else {  // numeric
      if (v.is_string()) {
        const auto& names = rule_field_names();
        if (std::find(names.begin(), names.end(), v.get<std::string>()) == names.end())
          errs.emplace_back(p, "'" + op + "' takes a number or a numeric entry field name; '" +
                                   v.get<std::string>() + "' is not a field");
      } else if (!v.is_number()) {
        errs.emplace_back(p, "'" + op + "' takes a number");
      }
    }
  }
}

void validate(const json& match, const std::string& ptr, std::vector<std::pair<std::string, std::string>>& errs) {
  if (!match.is_object()) {
    errs.emplace_back(ptr, "a match must be a table");
    return;
  }
  for (auto it = match.begin(); it != match.end(); ++it) {
    const std::string& key = it.key();
    const json& v = it.value();
    std::string p = ptr + "/" + key;
    if (std::find(kMatchKeys.begin(), kMatchKeys.end(), key) == kMatchKeys.end()) {
      std::string hint = detail::closest_key(key, kMatchKeys);
      errs.emplace_back(p, "unknown match key '" + key + "'" +
                               (hint.empty() ? "" : "; did you mean '" + hint + "'?") +
                               " (valid: engine model gpu_cc env arg field any all not)");
    } else if (key == "engine") {
      json names = v.is_array() ? v : json::array({v});
      for (const auto& n : names)
        if (!n.is_string() || !engine_kind_from_string(n.get<std::string>()))
          errs.emplace_back(p, "engine " + dump_safe(n) + " is not one of native, vllm, llama.cpp, command");
    } else if (key == "model") {
      if (!v.is_string() && !v.is_array()) errs.emplace_back(p, "'model' takes a name or an array of names");
    } else if (key == "gpu_cc") {
      validate_cond(v, p, errs);
    } else if (key == "env" || key == "arg" || key == "field") {
      if (!v.is_object()) {
        errs.emplace_back(p, "'" + key + "' takes a table of name = condition");
        continue;
      }
      for (auto e = v.begin(); e != v.end(); ++e) {
        if (key == "field") {
          const auto& names = rule_field_names();
          if (std::find(names.begin(), names.end(), e.key()) == names.end()) {
            std::string hint = detail::closest_key(e.key(), names);
            errs.emplace_back(p + "/" + e.key(), "unknown field '" + e.key() + "'" +
                                                     (hint.empty() ? "" : "; did you mean '" + hint + "'?"));
          }
        }
        validate_cond(e.value(), p + "/" + e.key(), errs);
      }
    } else if (key == "any" || key == "all") {
      if (!v.is_array() || v.empty()) {
        errs.emplace_back(p, "'" + key + "' takes a non-empty array of match tables");
        continue;
      }
      for (std::size_t i = 0; i < v.size(); ++i) validate(v[i], p + "/" + std::to_string(i), errs);
    } else if (key == "not") {
      validate(v, p, errs);
    }
  }
}

}  // namespace

std::optional<std::string> arg_value(const std::vector<std::string>& args, std::string_view flag) {
  std::optional<std::string> out;
  const std::string f(flag);
  for (std::size_t i = 0; i < args.size(); ++i) {
    if (args[i] == f) {
      if (i + 1 < args.size() && args[i + 1].rfind("--", 0) != 0) out = args[i + 1];
      else out = std::string();
    } else if (args[i].rfind(f + "=", 0) == 0) {
      out = args[i].substr(f.size() + 1);
    }
  }
  return out;
}

const std::vector<std::string>& rule_field_names() {
  static const std::vector<std::string> names = {
      "ctx", "validated_ctx", "prefilled_ctx", "model_max_ctx", "kv_cache_bytes_per_token", "kv_cache_bytes",
      "util", "host_ram_gib", "cpu_offload_gib", "shm_gib", "load_floor_offload_gib", "hot_profile_offload_gib",
      "pins_host_memory", "uses_cuda_ipc", "requires_gpu", "gpu", "port", "hot_profile", "checkpoint", "program",
      "served_name"};
  return names;
}

std::optional<std::string> field_value(const ModelEntry& m, std::string_view name) {
  auto num = [](const auto& opt) -> std::optional<std::string> {
    if (!opt) return std::nullopt;
    return detail::format_number(static_cast<double>(*opt));
  };
  auto text = [](const std::string& s) -> std::optional<std::string> {
    if (s.empty()) return std::nullopt;
    return s;
  };
  if (name == "ctx") return std::to_string(m.ctx);
  if (name == "validated_ctx") return num(m.validated_ctx);
  if (name == "prefilled_ctx") return num(m.prefilled_ctx);
  if (name == "model_max_ctx") return num(m.model_max_ctx);
  if (name == "kv_cache_bytes_per_token") return num(m.kv_cache_bytes_per_token);
  if (name == "kv_cache_bytes") return num(m.kv_cache_bytes());
  if (name == "util") return num(m.util);
  if (name == "host_ram_gib") return num(m.host_ram_gib);
  if (name == "cpu_offload_gib") return num(m.cpu_offload_gib);
  if (name == "shm_gib") return num(m.shm_gib);
  if (name == "load_floor_offload_gib") return num(m.load_floor_offload_gib);
  if (name == "hot_profile_offload_gib") return num(m.hot_profile_offload_gib);
  if (name == "pins_host_memory") return m.pins_host_memory ? "true" : "false";
  if (name == "uses_cuda_ipc") return m.uses_cuda_ipc ? "true" : "false";
  if (name == "requires_gpu") return m.needs_gpu() ? "true" : "false";
  if (name == "gpu") return std::to_string(m.gpu);
  if (name == "port") return std::to_string(m.port);
  if (name == "hot_profile") return text(m.hot_profile);
  if (name == "checkpoint") return text(m.checkpoint);
  if (name == "program") return text(m.program);
  if (name == "served_name") return text(m.served_name);
  return std::nullopt;
}

RuleSubject make_rule_subject(const ModelEntry& m, const ServerConfig& server, std::optional<int> gpu_cc) {
  RuleSubject s;
  s.model = &m;
  LaunchSpec spec = render_launch(m, m.port, server);
  if (!spec.argv.empty()) s.args.assign(spec.argv.begin() + 1, spec.argv.end());
  s.raw_args = m.args;
  s.env = spec.env;
  s.raw_env = m.env;
  s.gpu_cc = gpu_cc;
  return s;
}

std::string RuleHit::message() const {
  std::string out = evidence;
  if (rule) out += (out.empty() ? "" : ": ") + rule->reason;
  return out;
}

std::optional<RuleHit> evaluate_rule(const Rule& rule, const RuleSubject& subject) {
  if (!subject.model) return std::nullopt;
  Outcome o = eval_match(rule.match.is_object() ? rule.match : json::object(), subject);
  if (!o.matched) return std::nullopt;
  RuleHit hit;
  hit.rule = &rule;
  hit.gpu_cc_assumed = o.cc_assumed;
  for (const auto& e : o.evidence) hit.evidence += (hit.evidence.empty() ? "" : "; ") + e;
  return hit;
}

std::vector<RuleHit> evaluate_rules(const std::vector<Rule>& rules, const RuleSubject& subject) {
  std::vector<RuleHit> out;
  for (const auto& r : rules)
    if (auto h = evaluate_rule(r, subject)) out.push_back(*h);
  return out;
}

std::vector<std::pair<std::string, std::string>> validate_match(const json& match) {
  std::vector<std::pair<std::string, std::string>> errs;
  validate(match, "", errs);
  return errs;
}

}  // namespace servedeck::registry
