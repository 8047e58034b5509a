#include "registry/discovery.hpp"

#include "common/json_limits.hpp"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <unistd.h>

#include <nlohmann/json.hpp>

namespace servedeck::registry {

namespace fs = std::filesystem;

MaxCtxDiscovery discover_model_max_ctx(const std::string& checkpoint_dir) {
  MaxCtxDiscovery d;
  if (checkpoint_dir.empty()) return d;
  fs::path cfg = fs::path(checkpoint_dir) / "config.json";
  std::error_code ec;
  if (!fs::is_regular_file(cfg, ec)) return d;
  d.config_exists = true;
  std::ifstream in(cfg);
  if (!in) {
    d.error = cfg.string() + ": cannot be opened";
    return d;
  }
  std::stringstream ss;
  ss << in.rdbuf();
  JsonError perr;
  nlohmann::json j = parse_untrusted(ss.str(), &perr);
  if (j.is_discarded() || !j.is_object()) {
    d.error = cfg.string() + ": not a JSON object" + (j.is_discarded() ? " (" + perr.message + ")" : std::string());
    return d;
  }
  auto take = [&](const nlohmann::json& obj, const char* source) {
    auto it = obj.find("max_position_embeddings");
    if (it == obj.end()) return false;
    if (!it->is_number_integer() || it->get<int64_t>() <= 0) {
      d.error = cfg.string() + ": " + source + " = " + dump_safe(*it) + " is not a positive integer";
      return true;
    }
    d.max_ctx = it->get<int64_t>();
    d.source = std::string("config.json ") + source;
    return true;
  };
  if (take(j, "max_position_embeddings")) return d;
  auto tc = j.find("text_config");
  if (tc != j.end() && tc->is_object()) take(*tc, "text_config.max_position_embeddings");
  return d;
}

std::string resolve_config_path(const std::string& p, const std::string& base_dir) {
  if (p.empty()) return p;
  fs::path out;
  if (p == "~" || p.rfind("~/", 0) == 0) {
    const char* home = std::getenv("HOME");
    out = fs::path(home ? home : "/") / (p.size() > 2 ? p.substr(2) : std::string());
  } else if (fs::path(p).is_absolute()) {
    out = p;
  } else {
    out = fs::path(base_dir) / p;
  }
  return out.lexically_normal().string();
}

std::string resolve_program(const std::string& program) {
  if (program.empty()) return "";
  if (program.find('/') != std::string::npos) return program;
  const char* path = std::getenv("PATH");
  std::string dirs = path ? path : "/usr/local/bin:/usr/bin:/bin";
  std::size_t start = 0;
  while (start <= dirs.size()) {
    std::size_t colon = dirs.find(':', start);
    std::string dir = dirs.substr(start, colon == std::string::npos ? std::string::npos : colon - start);
    if (dir.empty()) dir.assign(1, '.');  // note: `dir = "."` trips GCC 12 -Wrestrict at -O3 (false positive)
    fs::path cand = fs::path(dir) / program;
    std::error_code ec;
    if (fs::is_regular_file(cand, ec) && ::access(cand.c_str(), X_OK) == 0) return cand.string();
    if (colon == std::string::npos) break;
    start = colon + 1;
  }
  return "";
}

}  // namespace servedeck::registry
