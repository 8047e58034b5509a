// The measuring verbs: `soak`, `probe amnesia`, `compare` (gateway/tools). They are clients: soak
// talks to the gateway (the daemon's port, or --url), probe and compare talk to engines (the
// running slot's engine, or --url / --baseline / --candidate as HOST:PORT).
#include <fstream>
#include <iostream>
#include <sstream>
#include <stdexcept>

#include "common/json_limits.hpp"
#include "gateway/cli/cli_common.hpp"
#include "gateway/tools/amnesia_probe.hpp"
#include "gateway/tools/compare.hpp"
#include "gateway/tools/soak.hpp"

namespace servedeck::cli {

namespace {

/// "HOST:PORT" → (host, port). Throws std::invalid_argument naming the flag.
std::pair<std::string, int> host_port(const std::string& flag, const std::string& v) {
  std::string s = v;
  if (s.rfind("http://", 0) == 0) s = s.substr(7);
  while (!s.empty() && s.back() == '/') s.pop_back();
  if (auto slash = s.find('/'); slash != std::string::npos) s = s.substr(0, slash);
  auto colon = s.rfind(':');
  if (colon == std::string::npos || colon == 0)
    throw std::invalid_argument(flag + " " + v + ": expected HOST:PORT, e.g. 127.0.0.1:8090");
  int port = 0;
  try {
    port = std::stoi(s.substr(colon + 1));
  } catch (const std::exception&) {
    throw std::invalid_argument(flag + " " + v + ": the port is not a number");
  }
  if (port <= 0 || port > 65535) throw std::invalid_argument(flag + " " + v + ": port out of range 1..65535");
  return {s.substr(0, colon), port};
}

int int_flag(const Args& a, const std::string& flag, int fallback, int lo, int hi) {
  if (!a.has(flag)) return fallback;
  int v = 0;
  try {
    v = std::stoi(a.get(flag));
  } catch (const std::exception&) {
    throw std::invalid_argument(flag + " " + a.get(flag) + ": expected an integer");
  }
  if (v < lo || v > hi)
    throw std::invalid_argument(flag + " " + std::to_string(v) + ": expected " + std::to_string(lo) + ".." + std::to_string(hi));
  return v;
}

/// The daemon's gateway address, and (when an engine is ready) its engine address and served name.
struct Running {
  std::string gateway_host;
  int gateway_port = 0;
  std::string engine_host = "127.0.0.1";
  int engine_port = 0;
  std::string served_name;
  StateDir state;  // where the daemon was looked for (guessed_because set when only guessed)
};

Running running(const Args& a) {
  Running r;
  std::string why;
  r.state = resolve_state_dir(a);
  auto d = find_daemon(r.state.dir, why);
  if (!d) return r;
  r.gateway_host = d->host;
  r.gateway_port = d->port;
  try {
    int status = 0;
    nlohmann::json s = admin_json(*d, "GET", "/admin/status", nullptr, status);
    if (status == 200 && s.value("state", "") == "ready") {
      r.engine_port = s.value("port", 0);
      r.served_name = s.value("served_name", "");
    }
  } catch (const std::exception&) {
    // No status: the caller names what it needs.
  }
  return r;
}

}  // namespace

int cmd_soak(const Args& a) {
  tools::SoakOptions o;
  Running r;
  if (a.has("--url")) {
    std::tie(o.host, o.port) = host_port("--url", a.get("--url"));
  } else {
    r = running(a);
    if (r.gateway_port == 0) {
      if (!r.state.guessed_because.empty())
        std::cerr << "servedeck soak: cannot tell where the daemon is: " << r.state.guessed_because
                  << "; or pass --url HOST:PORT\n";
      else
        std::cerr << "servedeck soak: no daemon found in " << r.state.dir << "; start one or pass --url HOST:PORT\n";
      return 2;
    }
    o.host = r.gateway_host;
    o.port = r.gateway_port;
  }
  o.model = a.get("--model", r.served_name);
  if (o.model.empty()) {
    std::cerr << "servedeck soak: --model is required when no engine is ready\n";
    return 2;
  }
  o.turns = int_flag(a, "--turns", 20, 1, 10000);
  o.tools = int_flag(a, "--tools", 50, 0, 1000);
  o.max_tokens = int_flag(a, "--max-tokens", 64, 1, 1 << 20);
  o.time_limit_s = int_flag(a, "--time-limit", 600, 1, 7 * 86400);
  o.api_key = a.get("--api-key");
  o.cold_prefix = a.has("--cold-prefix");
  std::cout << "soak: " << o.turns << " turns against " << o.host << ":" << o.port << " model " << o.model << ", "
            << o.tools << " tools, max_tokens " << o.max_tokens << (o.cold_prefix ? ", cold prefix" : "") << "\n";
  auto report = tools::run_soak(o, a.has("--json") ? nullptr : &std::cout);
  if (a.has("--json")) {
    std::cout << dump_safe(report.to_json(), 2) << "\n";
  } else {
    std::cout << report.table();
  }
  return report.failed_turn ? 1 : 0;
}

int cmd_probe(const Args& a) {
  if (a.positional.empty() || a.positional[0] != "amnesia") {
    std::cerr << "servedeck probe: the probe is `servedeck probe amnesia [--url HOST:PORT] [--model ID] "
                 "[--conversation FILE] [--continuation TEXT]`\n";
    return 2;
  }
  tools::AmnesiaOptions o;
  Running r;
  if (a.has("--url")) {
    std::tie(o.host, o.port) = host_port("--url", a.get("--url"));
  } else {
    r = running(a);
    if (r.engine_port == 0) {
      if (r.gateway_port == 0 && !r.state.guessed_because.empty())
        std::cerr << "servedeck probe amnesia: cannot tell where the daemon is: " << r.state.guessed_because
                  << "; or pass --url HOST:PORT of an engine\n";
      else
        std::cerr << "servedeck probe amnesia: no ready engine found through the daemon; pass --url HOST:PORT of an engine\n";
      return 2;
    }
    o.host = r.engine_host;
    o.port = r.engine_port;
  }
  o.model = a.get("--model", r.served_name);
  if (a.has("--conversation")) {
    std::ifstream in(a.get("--conversation"));
    if (!in) throw std::invalid_argument("--conversation " + a.get("--conversation") + ": cannot open");
    std::stringstream ss;
    ss << in.rdbuf();
    auto j = parse_untrusted(ss.str());
    if (j.is_object() && j.contains("messages")) {
      if (j.contains("tools")) o.tools = j["tools"];
      j = j["messages"];
    }
    if (!j.is_array())
      throw std::invalid_argument("--conversation " + a.get("--conversation") + ": expected a JSON array of messages or {\"messages\": [...]}");
    o.messages = j;
  } else {
    o.messages = tools::default_amnesia_conversation();
  }
  if (a.has("--continuation")) o.continuation = a.get("--continuation");
  auto report = tools::run_amnesia_probe(o);
  std::cout << (a.has("--json") ? dump_safe(report.to_json(), 2) + "\n" : report.table());
  return 0;
}

int cmd_compare(const Args& a) {
  tools::CompareOptions o;
  if (!a.has("--baseline") || !a.has("--candidate")) {
    std::cerr << "servedeck compare: --baseline HOST:PORT and --candidate HOST:PORT are required (engine addresses)\n";
    return 2;
  }
  std::tie(o.baseline_host, o.baseline_port) = host_port("--baseline", a.get("--baseline"));
  std::tie(o.candidate_host, o.candidate_port) = host_port("--candidate", a.get("--candidate"));
  o.baseline_model = a.get("--baseline-model", a.get("--model"));
  o.candidate_model = a.get("--candidate-model", a.get("--model"));
  if (a.has("--prompts")) {
    std::ifstream in(a.get("--prompts"));
    if (!in) throw std::invalid_argument("--prompts " + a.get("--prompts") + ": cannot open");
    std::stringstream ss;
    ss << in.rdbuf();
    auto j = parse_untrusted(ss.str());
    if (!j.is_array()) throw std::invalid_argument("--prompts " + a.get("--prompts") + ": expected a JSON array of strings");
    for (const auto& p : j) {
      if (!p.is_string()) throw std::invalid_argument("--prompts: every entry must be a string");
      o.prompts.push_back(p.get<std::string>());
    }
  }
  auto report = tools::run_compare(o);
  std::cout << (a.has("--json") ? dump_safe(report.to_json(), 2) + "\n" : report.table());
  return report.pass ? 0 : 1;
}

}  // namespace servedeck::cli
