// Verbs that work without a daemon: lint (registry::lint_registry) and preflight (runs the
// checks locally against this machine).
#include <iostream>

#include "gateway/cli/cli_common.hpp"
#include "preflight/preflight.hpp"
#include "registry/registry.hpp"

namespace servedeck::cli {

int cmd_lint(const Args& a) {
  std::string path = config_path(a);
  auto diags = registry::lint_registry(path);
  int errors = 0, warnings = 0;
  for (const auto& d : diags) {
    (d.severity == "error" ? errors : warnings)++;
    std::cout << d.to_string() << "\n";
  }
  if (diags.empty()) std::cout << path << ": no problems\n";
  else std::cout << path << ": " << errors << " error(s), " << warnings << " warning(s)\n";
  return errors > 0 ? 1 : 0;
}

int cmd_preflight(const Args& a) {
  if (a.positional.size() != 1) {
    std::cerr << "usage: servedeck preflight MODEL [--json]\n";
    return 2;
  }
  registry::Registry reg;
  try {
    reg = registry::load_registry(config_path(a));
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
  if (a.has("--json")) std::cout << report.to_json().dump(2) << "\n";
  else std::cout << report.table() << (report.table().empty() || report.table().back() != '\n' ? "\n" : "");
  // Exit 1 on a refusal so scripts can gate a launch on it.
  return report.refused() ? 1 : 0;
}

}  // namespace servedeck::cli
