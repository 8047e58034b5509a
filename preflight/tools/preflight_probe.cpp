// preflight-probe CONFIG MODEL [--json] [--port N]: runs the preflight of MODEL from CONFIG against
// this machine's real readings (NVML, /proc) and prints the table (or JSON). The same output as
// `servedeck preflight MODEL`, without a daemon; used to record the real readings in docs/.
// Exit status: 0 no refusal, 1 refused, 2 usage or registry error.
#include <cstdlib>
#include <iostream>
#include <string>

#include "common/json_limits.hpp"
#include "preflight/preflight.hpp"
#include "registry/registry.hpp"

int main(int argc, char** argv) {
  using namespace servedeck;
  if (argc < 3) {
    std::cerr << "usage: preflight-probe CONFIG MODEL [--json] [--port N]\n";
    return 2;
  }
  bool json = false;
  int port = 0;
  for (int i = 3; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--json") json = true;
    else if (a == "--port" && i + 1 < argc) port = std::atoi(argv[++i]);
  }
  try {
    registry::Registry reg = registry::load_registry(argv[1]);
    const registry::ModelEntry* m = reg.find_by_name(argv[2]);
    if (!m) m = reg.find_by_id(argv[2]);
    if (!m) {
      std::cerr << argv[1] << ": no model named '" << argv[2] << "'\n";
      return 2;
    }
    auto readings = preflight::system_readings();
    preflight::Report r = preflight::run_preflight(reg, *m, *readings, port == 0 ? m->port : port);
    if (json) std::cout << servedeck::dump_safe(r.to_json(), 2) << "\n";
    else std::cout << r.table();
    return r.refused() ? 1 : 0;
  } catch (const registry::RegistryError& e) {
    for (const auto& d : e.diagnostics) std::cerr << d.to_string() << "\n";
    return 2;
  }
}
