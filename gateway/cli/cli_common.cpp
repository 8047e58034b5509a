#include "gateway/cli/cli_common.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <stdexcept>

#include "common/http/client.hpp"
#include "gateway/admin/admin_token.hpp"
#include "common/json_limits.hpp"
#include "common/sse.hpp"
#include "registry/registry.hpp"

namespace servedeck::cli {

namespace {
const std::set<std::string> k_value_flags = {"--config", "--state-dir", "--port", "--model", "--lines", "--url",
                                             "--turns", "--tools", "--max-tokens", "--time-limit", "--api-key",
                                             "--conversation", "--continuation", "--baseline", "--candidate",
                                             "--baseline-model", "--candidate-model", "--prompts"};
const std::set<std::string> k_bool_flags = {"--json", "-f", "--follow", "--help", "-h", "--cold-prefix"};
}  // namespace

std::string Args::get(const std::string& flag, const std::string& fallback) const {
  auto it = opts.find(flag);
  return it == opts.end() ? fallback : it->second;
}

Args parse_args(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string s = argv[i];
    if (s.size() > 1 && s[0] == '-') {
      std::string name = s, value;
      auto eq = s.find('=');
      if (eq != std::string::npos) {
        name = s.substr(0, eq);
        value = s.substr(eq + 1);
      }
      if (k_value_flags.count(name)) {
        if (eq == std::string::npos) {
          if (i + 1 >= argc) throw std::invalid_argument(name + " needs a value");
          value = argv[++i];
        }
        a.opts[name] = value;
      } else if (k_bool_flags.count(name)) {
        a.opts[name == "-f" ? "--follow" : name == "-h" ? "--help" : name] = "1";
      } else {
        throw std::invalid_argument("unknown flag " + name);
      }
    } else if (a.verb.empty()) {
      a.verb = s;
    } else {
      a.positional.push_back(s);
    }
  }
  return a;
}

std::optional<std::string> found_config(const Args& a) {
  if (a.has("--config")) return a.get("--config");
  std::error_code ec;
  if (std::filesystem::exists("models.toml", ec)) return "models.toml";
  if (std::filesystem::exists("/etc/servedeck/models.toml", ec)) return "/etc/servedeck/models.toml";
  return std::nullopt;
}

std::string config_path(const Args& a) { return found_config(a).value_or("/etc/servedeck/models.toml"); }

std::string no_config_message() {
  std::error_code ec;
  std::string cwd = std::filesystem::current_path(ec).string();
  if (ec) cwd = ".";
  return "no models.toml in " + cwd + " or /etc/servedeck; pass --config FILE";
}

std::string state_dir_for(const Args& a, const registry::Registry& reg) {
  if (a.has("--state-dir")) return a.get("--state-dir");
  if (const char* e = std::getenv("SERVEDECK_STATE_DIR"); e && *e) return e;
  return reg.server.state_dir;
}

StateDir resolve_state_dir(const Args& a) {
  if (a.has("--state-dir")) return {a.get("--state-dir"), ""};
  if (const char* e = std::getenv("SERVEDECK_STATE_DIR"); e && *e) return {e, ""};
  const std::string fallback = "/var/lib/servedeck";
  auto config = found_config(a);
  if (!config)
    return {fallback, no_config_message() + " (the running daemon's) or --state-dir DIR"};
  try {
    return {registry::load_registry(*config).server.state_dir, ""};
  } catch (const registry::RegistryError& e) {
    std::string first = e.diagnostics.empty() ? e.what() : e.diagnostics.front().to_string();
    return {fallback, *config + " does not load (" + first + "; `servedeck lint` lists every problem); fix it, "
                      "or pass --state-dir DIR"};
  } catch (const std::exception& e) {
    return {fallback, *config + " does not load (" + e.what() + "); fix it, or pass --state-dir DIR"};
  }
}

std::string state_dir(const Args& a) { return resolve_state_dir(a).dir; }

std::string daemon_file(const std::string& dir) { return (std::filesystem::path(dir) / "daemon.json").string(); }

std::string access_hint() {
  return "run as the daemon's user or root, or as a member of the daemon's group (the systemd unit's: servedeck); "
         "docs/operations.md, Security";
}

std::string admin_refusal_hint(const DaemonAddress& d, int status) {
  if (status != 401 || !d.admin_token.empty()) return "";
  return " (" + d.token_problem + "; " + access_hint() + ")";
}

std::optional<DaemonAddress> find_daemon(const std::string& dir, std::string& why, bool* denied) {
  if (denied) *denied = false;
  const std::string path = daemon_file(dir);
  if (::access(path.c_str(), R_OK) != 0 && errno != ENOENT) {
    why = "cannot read " + path + ": " + std::strerror(errno);
    if (denied) *denied = true;
    return std::nullopt;
  }
  std::ifstream f(path);
  if (!f) {
    why = "no " + path;
    return std::nullopt;
  }
  // note: daemon.json is a few hundred bytes; 64 KiB bounds a file someone else wrote there.
  constexpr std::size_t k_max_daemon_file = 64 * 1024;
  std::string text(k_max_daemon_file + 1, '\0');
  f.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<std::size_t>(f.gcount()));
  JsonError perr;
  auto j = parse_untrusted(text, &perr, {.max_depth = 8, .max_bytes = k_max_daemon_file});
  if (j.is_discarded() || !j.is_object() || !j.contains("port") || !j["port"].is_number_integer()) {
    why = daemon_file(dir) + " is not {\"host\",\"port\",...} JSON" + (j.is_discarded() ? ": " + perr.message : "");
    return std::nullopt;
  }
  DaemonAddress d;
  d.host = j.contains("host") && j["host"].is_string() ? j["host"].get<std::string>() : "127.0.0.1";
  if (d.host == "0.0.0.0" || d.host.empty()) d.host = "127.0.0.1";
  if (d.host == "::") d.host = "::1";
  d.port = j["port"].get<int>();
  d.pid = j.contains("pid") && j["pid"].is_number_integer() ? j["pid"].get<int64_t>() : 0;
  if (auto t = admin::read_admin_token(dir, d.token_problem)) d.admin_token = *t;
  return d;
}

namespace {
void authorize(http::ClientRequest& r, const DaemonAddress& d) {
  if (!d.admin_token.empty()) r.headers.push_back({"Authorization", "Bearer " + d.admin_token});
}
}  // namespace

nlohmann::json admin_json(const DaemonAddress& d, const std::string& method, const std::string& target,
                          const nlohmann::json& body, int& status) {
  http::ClientRequest r;
  r.host = d.host;
  r.port = d.port;
  r.method = method;
  r.target = target;
  authorize(r, d);
  if (method != "GET") r.body = dump_safe(body);
  r.timeout_ms = 120000;  // preflight reads NVML; status reads /proc
  auto res = http::fetch(r);
  status = res.status;
  auto j = parse_untrusted(res.body);
  if (j.is_discarded()) return nlohmann::json{{"raw", res.body}};
  return j;
}

nlohmann::json admin_stream(const DaemonAddress& d, const std::string& target, const nlohmann::json& body,
                            const std::function<void(const std::string&)>& on_line) {
  http::ClientRequest r;
  r.host = d.host;
  r.port = d.port;
  r.method = "POST";
  r.target = target;
  authorize(r, d);
  r.body = dump_safe(body);
  // note: the gap between progress lines can be long (a silent model load is bounded by its
  // start_timeout_s, 600 s by default, times the extension cap): allow an hour of silence.
  r.timeout_ms = 3600 * 1000;
  sse::Parser parser;
  nlohmann::json result;
  int status = 0;
  std::string error_body;
  auto take = [&](const sse::Event& e) {
    if (e.comment) return;
    if (e.event == "result") {
      result = parse_untrusted(e.data);
      if (result.is_discarded()) result = {{"ok", false}, {"error", "malformed result event: " + e.data}};
    } else {
      on_line(e.data);
    }
  };
  http::fetch_stream(r, [&](int st, const std::map<std::string, std::string>&) { status = st; },
                     [&](std::string_view chunk) {
                       if (status != 200) {
                         error_body += chunk;
                         return true;
                       }
                       for (const auto& e : parser.feed(chunk)) take(e);
                       return true;
                     });
  if (status != 200) {
    auto j = parse_untrusted(error_body);
    std::string msg = j.is_object() && j.contains("error") && j["error"].is_object() && j["error"].contains("message") &&
                              j["error"]["message"].is_string()
                          ? j["error"]["message"].get<std::string>() : error_body;
    return {{"ok", false}, {"error", "daemon answered HTTP " + std::to_string(status) + ": " + msg + admin_refusal_hint(d, status)}};
  }
  if (auto e = parser.finish()) take(*e);
  if (result.is_null()) return {{"ok", false}, {"error", "the daemon closed the stream without a result"}};
  return result;
}

}  // namespace servedeck::cli
