// render_launch and the placeholder vocabulary.
#include <algorithm>
#include <cctype>

#include "registry/registry.hpp"
#include "registry/toml_reader.hpp"

namespace servedeck::registry {

const std::vector<std::string>& placeholder_names() {
  static const std::vector<std::string> names = {"port", "host", "ctx", "model", "served_name", "gpu",
                                                 "kv_cache_bytes", "util", "cpu_offload_gib", "name",
                                                 "state_dir", "hot_profile", "config_dir"};
  return names;
}

std::vector<std::string> placeholders_in(std::string_view text) {
  std::vector<std::string> out;
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (text[i] != '{') continue;
    std::size_t j = i + 1;
    if (j >= text.size() || !(std::islower(static_cast<unsigned char>(text[j])) || text[j] == '_')) continue;
    while (j < text.size() && (std::islower(static_cast<unsigned char>(text[j])) ||
                               std::isdigit(static_cast<unsigned char>(text[j])) || text[j] == '_'))
      ++j;
    if (j < text.size() && text[j] == '}') {
      out.emplace_back(text.substr(i + 1, j - i - 1));
      i = j;
    }
  }
  return out;
}

namespace {

/// `text` with every {name} of `values` replaced. Linear: a name is looked for only within the
/// longest placeholder name's reach of its '{', so a run of '{' without '}' costs O(n), not O(n²).
std::string fill(std::string_view text, const std::map<std::string, std::string>& values) {
  std::size_t longest = 0;
  for (const auto& [name, value] : values) longest = std::max(longest, name.size());
  std::string out;
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '{') {
      std::size_t close = text.substr(i + 1, longest + 1).find('}');
      if (close != std::string_view::npos) {
        close += i + 1;
        auto it = values.find(std::string(text.substr(i + 1, close - i - 1)));
        if (it != values.end()) {
          out += it->second;
          i = close;
          continue;
        }
      }
    }
    out += text[i];
  }
  return out;
}

}  // namespace

std::map<std::string, std::string> placeholder_values(const ModelEntry& m, int port, const ServerConfig& server) {
  std::map<std::string, std::string> v;
  v["port"] = std::to_string(port);
  v["host"] = m.host;
  v["ctx"] = std::to_string(m.ctx);
  v["model"] = m.checkpoint;
  v["served_name"] = m.served_name;
  v["gpu"] = std::to_string(m.gpu);
  v["name"] = m.name;
  v["state_dir"] = server.state_dir;
  v["config_dir"] = m.config_dir;
  if (auto kv = m.kv_cache_bytes()) v["kv_cache_bytes"] = std::to_string(*kv);
  if (m.util) v["util"] = detail::format_number(*m.util);
  if (m.cpu_offload_gib) v["cpu_offload_gib"] = detail::format_number(*m.cpu_offload_gib);
  if (!m.hot_profile.empty()) v["hot_profile"] = m.hot_profile;
  return v;
}

LaunchSpec render_launch(const ModelEntry& m, int port, const ServerConfig& server) {
  auto values = placeholder_values(m, port, server);
  LaunchSpec spec;
  spec.program = fill(m.program, values);
  spec.argv.push_back(spec.program);
  for (const auto& a : m.args) spec.argv.push_back(fill(a, values));
  for (const auto& [k, val] : m.env) spec.env[k] = fill(val, values);
  if (!spec.env.count("CUDA_VISIBLE_DEVICES")) spec.env["CUDA_VISIBLE_DEVICES"] = std::to_string(m.gpu);
  spec.host = m.host;
  spec.port = port;
  return spec;
}

}  // namespace servedeck::registry
