// Verbs that work without a daemon: lint (registry::lint_registry) and preflight (runs the
// checks locally against this machine).
#include <iostream>

#include "common/json_limits.hpp"
#include "gateway/cli/cli_common.hpp"
#include "preflight/preflight.hpp"
#include "registry/registry.hpp"
#include "registry/rules.hpp"

namespace servedeck::cli {

namespace {

/// "16 rules evaluated against 7 models, none match" (or "…, 2 matches (above)"): the [[rules]]
/// verdict line of `lint`, counted like registry::lint_registry evaluates them (GPU unknown).
/// Empty when `path` cannot be read (lint_registry already reported that).
std::string rules_summary(const std::string& path) {
  std::string error;  // lint_registry printed it
  auto text = registry::read_registry_file(path, error);
  if (!text) return "";
  std::vector<registry::Diagnostic> ignored;  // lint_registry printed them
  registry::Registry reg = registry::parse_registry(*text, path, ignored);
  std::size_t hits = 0;
  for (const auto& m : reg.models)
    hits += registry::evaluate_rules(reg.rules, registry::make_rule_subject(m, reg.server, std::nullopt)).size();
  auto count = [](std::size_t n, const char* what) {
    return std::to_string(n) + " " + what + (n == 1 ? "" : "s");
  };
  return count(reg.rules.size(), "rule") + " evaluated against " + count(reg.models.size(), "model") + ", " +
         (hits == 0 ? std::string("none match")
                   : std::to_string(hits) + (hits == 1 ? " match" : " matches") + " (above)");
}

}  // namespace

int cmd_lint(const Args& a) {
  auto found = found_config(a);
  if (!found) {
    std::cerr << "servedeck: lint: " << no_config_message() << "\n";
    return 2;
  }
  const std::string path = *found;
  auto diags = registry::lint_registry(path);
  int errors = 0, warnings = 0;
  for (const auto& d : diags) {
    (d.severity == "error" ? errors : warnings)++;
    std::cout << d.to_string() << "\n";
  }
  if (auto rules = rules_summary(path); !rules.empty()) std::cout << rules << "\n";
  if (diags.empty()) std::cout << path << ": no problems\n";
  else std::cout << path << ": " << errors << " error(s), " << warnings << " warning(s)\n";
  return errors > 0 ? 1 : 0;
}

int cmd_preflight(const Args& a) {
  if (a.positional.size() != 1) {
    std::cerr << "usage: servedeck preflight MODEL [--json]\n";
    return 2;
  }
  auto config = found_config(a);
  if (!config) {
    std::cerr << "servedeck: preflight: " << no_config_message() << "\n";
    return 2;
  }
  registry::Registry reg;
  try {
    reg = registry::load_registry(*config);
  } catch (const registry::RegistryError& e) {
    for (const auto& d : e.diagnostics) std::cerr << d.to_string() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "servedeck: preflight: " << e.what() << "\n";
    return 2;
  }
  const registry::ModelEntry* m = reg.find_by_name(a.positional[0]);
  if (!m) m = reg.find_by_id(a.positional[0]);
  if (!m) {
    std::cerr << "servedeck: preflight: unknown model '" << a.positional[0] << "' in " << reg.path << "\n";
    return 2;
  }
  if (a.has("--state-dir")) reg.server.state_dir = a.get("--state-dir");
  auto readings = preflight::system_readings();
  auto report = preflight::run_preflight(reg, *m, *readings, m->port);
  if (a.has("--json")) std::cout << dump_safe(report.to_json(), 2) << "\n";
  else std::cout << report.table() << (report.table().empty() || report.table().back() != '\n' ? "\n" : "");
  // Exit 1 on a refusal so scripts can gate a launch on it.
  return report.refused() ? 1 : 0;
}

}  // namespace servedeck::cli
