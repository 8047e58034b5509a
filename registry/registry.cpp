// models.toml: top level, [server], [[rules]], cross-entry checks, load and lint.
#include "registry/registry.hpp"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/json_limits.hpp"
#include "registry/discovery.hpp"
#include "registry/parse_internal.hpp"
#include "registry/rules.hpp"
#include "registry/toml_nesting.hpp"

namespace servedeck::registry {

namespace fs = std::filesystem;
using detail::DiagnosticSink;
using detail::TableReader;

std::string Diagnostic::to_string() const {
  std::string out = location.file;
  if (location.line > 0) out += ":" + std::to_string(location.line);
  return out + ": " + severity + ": " + message;
}

namespace {
std::string summarise(const std::vector<Diagnostic>& d) {
  std::string out;
  for (const auto& x : d)
    if (x.severity == "error") out += (out.empty() ? "" : "\n") + x.to_string();
  return out.empty() ? "models.toml: invalid" : out;
}
}  // namespace

RegistryError::RegistryError(std::vector<Diagnostic> d) : std::runtime_error(summarise(d)), diagnostics(std::move(d)) {}

namespace detail {

const std::vector<std::string>& server_keys() {
  static const std::vector<std::string> k = {"listen", "state_dir", "api_keys", "default_model", "max_body_bytes",
                                             "log_max_bytes", "log_keep", "restore_previous_on_failed_start",
                                             "allowed_hosts", "responses_retention_s", "history_retention_s",
                                             "history_max_rows", "shm_keep_unverifiable"};
  return k;
}

const std::vector<std::string>& rule_keys() {
  static const std::vector<std::string> k = {"id", "action", "reason", "match"};
  return k;
}

}  // namespace detail

namespace {

bool ascii_alnum(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'); }

/// A name for server.allowed_hosts: a DNS name ([A-Za-z0-9.-], not starting with '.' or '-') or
/// an IP address, without scheme, port or path.
bool is_host_name(const std::string& h) {
  if (h.empty() || h.size() > 253) return false;
  bool ipv6 = h.find(':') != std::string::npos;
  for (char c : h) {
    bool ok = ascii_alnum(c) || c == '.' || c == '-' || (ipv6 && c == ':');
    if (!ok) return false;
  }
  return h.front() != '.' && h.front() != '-';
}

/// The access and retention keys of [server] (docs/registry.md, docs/operations.md "Security").
void parse_retention_and_hosts(TableReader& r, DiagnosticSink& sink, ServerConfig& s) {
  if (auto v = r.string_array("allowed_hosts")) {
    s.allowed_hosts.clear();
    for (std::size_t i = 0; i < v->size(); ++i) {
      std::string h = (*v)[i];
      std::transform(h.begin(), h.end(), h.begin(), [](unsigned char c) { return std::tolower(c); });
      if (is_host_name(h)) {
        s.allowed_hosts.push_back(h);
        continue;
      }
      std::string key = "server.allowed_hosts[" + std::to_string(i) + "]";
      sink.error(r.line("allowed_hosts"), key,
                 key + " = \"" + (*v)[i] + "\" is not a host name; valid: a DNS name or IP address without scheme, "
                       "port or path, e.g. \"workstation.lan\"");
    }
  }
  if (auto v = r.integer("responses_retention_s", 0, int64_t{366} * 24 * 3600, "seconds"))
    s.responses_retention_s = *v;
  if (auto v = r.integer("history_retention_s", 60, int64_t{10} * 366 * 24 * 3600, "seconds"))
    s.history_retention_s = *v;
  if (auto v = r.integer("history_max_rows", 100, int64_t{1} << 31, "rows")) s.history_max_rows = *v;
}

void parse_server(const toml::table& t, const std::string& config_dir, DiagnosticSink& sink, ServerConfig& s) {
  TableReader r(t, "server", sink, detail::server_keys());
  if (auto v = r.string("listen")) {
    std::size_t colon = v->rfind(':');
    bool ok = colon != std::string::npos && colon > 0 && colon + 1 < v->size();
    int64_t port = -1;
    if (ok) {
      try {
        std::size_t used = 0;
        port = std::stoll(v->substr(colon + 1), &used);
        ok = used == v->size() - colon - 1 && port >= 0 && port <= 65535;
      } catch (const std::exception&) {
        ok = false;
      }
    }
    if (ok) {
      std::string host = v->substr(0, colon);
      if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
      s.listen_host = host;
      s.listen_port = static_cast<int>(port);
    } else {
      sink.error(r.line("listen"), "server.listen",
                 "server.listen = \"" + *v + "\" is not HOST:PORT; valid: e.g. \"127.0.0.1:8090\" (port 0-65535)");
    }
  }
  if (auto v = r.string("state_dir")) s.state_dir = resolve_config_path(*v, config_dir);
  if (auto v = r.string_array("api_keys")) s.api_keys = *v;
  if (auto v = r.string("default_model")) s.default_model = *v;
  if (auto v = r.integer("max_body_bytes", 1024, int64_t{1} << 34, "bytes")) s.max_body_bytes = static_cast<std::size_t>(*v);
  if (auto v = r.integer("log_max_bytes", 4096, int64_t{1} << 31, "bytes")) s.log_max_bytes = *v;
  if (auto v = r.integer("log_keep", 0, 1000, "files")) s.log_keep = static_cast<int>(*v);
  if (auto v = r.boolean("restore_previous_on_failed_start")) s.restore_previous_on_failed_start = *v;
  if (auto v = r.boolean("shm_keep_unverifiable")) s.shm_keep_unverifiable = *v;
  parse_retention_and_hosts(r, sink, s);
}

int line_for_pointer(const std::map<std::string, int>& lines, std::string ptr) {
  while (true) {
    auto it = lines.find(ptr);
    if (it != lines.end() && it->second > 0) return it->second;
    if (ptr.empty()) return 0;
    ptr = ptr.substr(0, ptr.rfind('/'));
  }
}

Rule parse_rule(const toml::table& t, std::size_t index, DiagnosticSink& sink) {
  std::string prefix = "rules[" + std::to_string(index) + "]";
  TableReader r(t, prefix, sink, detail::rule_keys());
  Rule rule;
  rule.location = SourceLocation{sink.file, detail::line_of(t), 0};
  if (auto v = r.string("id")) rule.id = *v;
  else if (!r.has("id")) sink.error(rule.location.line, prefix + ".id", prefix + ".id is missing; every rule needs a name");
  if (!rule.id.empty()) prefix = "rules." + rule.id;
  if (auto v = r.string("action")) {
    if (*v == "refuse" || *v == "warn") rule.action = *v;
    else sink.error(r.line("action"), prefix + ".action", prefix + ".action = \"" + *v + "\" is not valid; valid: refuse, warn");
  } else if (!r.has("action")) {
    sink.error(rule.location.line, prefix + ".action", prefix + ".action is missing; valid: refuse, warn");
  }
  if (auto v = r.string("reason"); v && !v->empty()) rule.reason = *v;
  else if (!r.has("reason") || (v && v->empty()))
    sink.error(rule.location.line, prefix + ".reason", prefix + ".reason is missing; say why, with the measured figure");
  if (auto m = r.subtable("match")) {
    std::map<std::string, int> lines;
    rule.match = detail::to_json(*m, &lines);
    for (const auto& [ptr, msg] : validate_match(rule.match)) {
      std::string key = prefix + ".match" + ptr;
      std::replace(key.begin() + static_cast<long>(prefix.size()), key.end(), '/', '.');
      sink.error(line_for_pointer(lines, ptr), key, key + ": " + msg);
    }
    if (rule.match.empty())
      sink.error(detail::line_of(*m), prefix + ".match", prefix + ".match is empty; it would match every entry");
  } else if (!r.has("match")) {
    sink.error(rule.location.line, prefix + ".match", prefix + ".match is missing; a rule needs a [rules.match] table");
  }
  return rule;
}

/// Ids (served names, aliases, preset aliases) must be unique across the file.
void check_ids(const Registry& reg, const std::vector<detail::KeyLines>& lines, DiagnosticSink& sink) {
  struct Owner {
    std::string model, what;
    int line;
  };
  std::map<std::string, Owner> seen;
  for (std::size_t mi = 0; mi < reg.models.size(); ++mi) {
    const ModelEntry& m = reg.models[mi];
    auto line = [&](const std::string& k) {
      auto it = lines[mi].find(k);
      return it != lines[mi].end() ? it->second : m.location.line;
    };
    std::vector<std::pair<std::string, Owner>> ids;
    ids.push_back({m.served_name, {m.name, "served_name", line("served_name")}});
    for (std::size_t i = 0; i < m.aliases.size(); ++i)
      ids.push_back({m.aliases[i], {m.name, "aliases[" + std::to_string(i) + "]", line("aliases[" + std::to_string(i) + "]")}});
    for (std::size_t i = 0; i < m.presets.size(); ++i)
      ids.push_back({m.presets[i].alias,
                     {m.name, "presets[" + std::to_string(i) + "].alias", line("presets[" + std::to_string(i) + "]")}});
    for (auto& [id, owner] : ids) {
      if (id.empty()) continue;
      auto it = seen.find(id);
      if (it != seen.end()) {
        std::string key = "models." + m.name + "." + owner.what;
        std::string kind = owner.what.rfind("presets", 0) == 0 ? "preset alias" : "id";
        sink.error(owner.line, key,
                   key + " = \"" + id + "\" collides: " + kind + " already used as models." + it->second.model + "." +
                       it->second.what + " (line " + std::to_string(it->second.line) +
                       "); every served name, alias and preset alias must be unique");
      } else {
        seen.emplace(id, owner);
      }
    }
  }
}

}  // namespace

bool valid_model_name(std::string_view name) {
  if (name.empty() || name.size() > 64 || !ascii_alnum(name[0])) return false;
  return std::all_of(name.begin(), name.end(), [](char c) { return ascii_alnum(c) || c == '.' || c == '_' || c == '-'; });
}

namespace {
// models.toml nests 3 or 4 deep ([models.X.policies], [rules.match]); these leave room and keep
// toml++'s recursion and the registry's walks far from the stack's end.
constexpr int k_max_toml_segments = 16;
constexpr int k_max_toml_brackets = 16;
}  // namespace

Registry parse_registry(std::string_view text, const std::string& path, std::vector<Diagnostic>& diagnostics) {
  DiagnosticSink sink;
  sink.file = path;
  Registry reg;
  reg.path = path;
  std::error_code ec;
  fs::path abs = fs::absolute(path, ec);
  reg.config_dir = (ec ? fs::path(".") : abs.parent_path()).lexically_normal().string();
  toml::table root;
  if (auto deep = check_toml_nesting(text, k_max_toml_segments, k_max_toml_brackets)) {
    sink.error(deep->line, "", "TOML nesting: " + deep->message);
    diagnostics = std::move(sink.diagnostics);
    return reg;
  }
  try {
    root = toml::parse(text, path);
  } catch (const toml::parse_error& e) {
    sink.error(static_cast<int>(e.source().begin.line), "",
               "TOML syntax: " + std::string(e.description()));
    diagnostics = std::move(sink.diagnostics);
    return reg;
  }
  TableReader top(root, "", sink, {"server", "models", "rules"});
  if (auto s = top.subtable("server")) parse_server(*s, reg.config_dir, sink, reg.server);
  std::vector<detail::KeyLines> lines;
  if (auto models = top.subtable("models")) {
    for (auto&& [k, v] : *models) {
      std::string name(k.str());
      if (!valid_model_name(name)) {
        sink.error(detail::line_of(v), "models",
                   "[models." + dump_safe(nlohmann::json(name)) + "]: a model name is 1 to 64 letters, digits, '.', '_' or '-', "
                   "starting with a letter or digit (it names files under state_dir, e.g. its hot-expert profile, and is the "
                   "API's model field)");
        continue;
      }
      auto t = v.as_table();
      if (!t) {
        sink.error(detail::line_of(v), "models." + name,
                   "models." + name + " = " + detail::show(v) + " has the wrong type; expected a table [models." + name + "]");
        continue;
      }
      lines.emplace_back();
      reg.models.push_back(detail::parse_model(name, *t, reg.config_dir, sink, lines.back()));
    }
  }
  if (auto rules = top.array("rules")) {
    std::map<std::string, int> ids;
    for (std::size_t i = 0; i < rules->size(); ++i) {
      const toml::node& n = *rules->get(i);
      auto t = n.as_table();
      if (!t) {
        sink.error(detail::line_of(n), "rules", "rules[" + std::to_string(i) + "] has the wrong type; expected [[rules]] tables");
        continue;
      }
      Rule r = parse_rule(*t, i, sink);
      if (!r.id.empty()) {
        auto [it, fresh] = ids.emplace(r.id, r.location.line);
        if (!fresh)
          sink.error(r.location.line, "rules." + r.id,
                     "rules.id = \"" + r.id + "\" is used twice (first at line " + std::to_string(it->second) + ")");
      }
      reg.rules.push_back(std::move(r));
    }
  }
  check_ids(reg, lines, sink);
  if (!reg.server.default_model.empty() && !reg.find_by_name(reg.server.default_model) &&
      !reg.find_by_id(reg.server.default_model)) {
    std::string valid;
    for (const auto& m : reg.models) valid += (valid.empty() ? "" : ", ") + m.name;
    const toml::node* dm = root.at_path("server.default_model").node();
    sink.error(dm ? detail::line_of(*dm) : 0, "server.default_model",
               "server.default_model = \"" + reg.server.default_model + "\" names no model; valid: " + valid);
  }
  diagnostics = std::move(sink.diagnostics);
  return reg;
}

Registry parse_registry(std::string_view text, const std::string& path) {
  std::vector<Diagnostic> d;
  Registry reg = parse_registry(text, path, d);
  if (std::any_of(d.begin(), d.end(), [](const Diagnostic& x) { return x.severity == "error"; }))
    throw RegistryError(std::move(d));
  return reg;
}

namespace {
/// A registry is a few KiB; the shipped one is ~20 KiB. Anything past this is the wrong file (or
/// a device such as /dev/zero, which would otherwise be read forever).
constexpr std::size_t k_max_registry_bytes = 4u << 20;
}  // namespace

std::optional<std::string> read_registry_file(const std::string& path, std::string& error) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    error = path + ": is a directory (expected a models.toml file)";
    return std::nullopt;
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    error = path + ": cannot be read (" + (fs::exists(path, ec) ? "permission denied" : "no such file") + ")";
    return std::nullopt;
  }
  std::string text;
  char buf[65536];
  while (in.read(buf, sizeof buf) || in.gcount() > 0) {
    text.append(buf, static_cast<std::size_t>(in.gcount()));
    if (text.size() > k_max_registry_bytes) {
      error = path + ": more than " + std::to_string(k_max_registry_bytes >> 20) +
              " MiB read (a models.toml is a few KiB; is this the right file?)";
      return std::nullopt;
    }
  }
  return text;
}


Registry load_registry(const std::string& path) {
  std::string error;
  auto text = read_registry_file(path, error);
  if (!text) throw RegistryError({Diagnostic{"error", SourceLocation{path, 0, 0}, "", error}});
  return parse_registry(*text, path);
}

std::vector<Diagnostic> lint_registry(const std::string& path) {
  std::string error;
  auto text = read_registry_file(path, error);
  if (!text) return {Diagnostic{"error", SourceLocation{path, 0, 0}, "", error}};
  std::vector<Diagnostic> d;
  Registry reg = parse_registry(*text, path, d);
  std::vector<Diagnostic> out, warnings;
  for (auto& x : d) (x.severity == "error" ? out : warnings).push_back(std::move(x));
  for (const auto& m : reg.models) {
    RuleSubject s = make_rule_subject(m, reg.server, std::nullopt);
    for (const auto& hit : evaluate_rules(reg.rules, s)) {
      std::string key = "models." + m.name;
      // A refusal that depends on the GPU model lint cannot see is a warning here; preflight,
      // which reads the GPU, refuses.
      bool refuse = hit.rule->action == "refuse" && !hit.gpu_cc_assumed;
      std::string action = hit.rule->action + (hit.gpu_cc_assumed && hit.rule->action == "refuse"
                                                   ? " on a matching GPU; preflight decides"
                                                   : "");
      Diagnostic diag{refuse ? "error" : "warning", m.location, key,
                      key + ": rule " + hit.rule->id + " (" + action + ", rule at line " +
                          std::to_string(hit.rule->location.line) + "): " + hit.message()};
      (diag.severity == "error" ? out : warnings).push_back(std::move(diag));
    }
  }
  out.insert(out.end(), warnings.begin(), warnings.end());
  return out;
}

}  // namespace servedeck::registry
