#include "worker/template/template_source.hpp"

#include <fstream>
#include <sstream>
#include <stdexcept>

namespace servedeck::worker {

namespace {

std::string read_text(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  if (!f) throw std::runtime_error("cannot read " + p.string());
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

}  // namespace

std::string chat_template_from_config(const nlohmann::json& config, std::string_view name) {
  if (!config.is_object() || !config.contains("chat_template")) {
    throw std::runtime_error("tokenizer_config.json: no \"chat_template\" key");
  }
  const auto& t = config["chat_template"];
  if (t.is_string()) return t.get<std::string>();
  if (t.is_array()) {
    std::string names;
    const std::string_view want = name.empty() ? std::string_view("default") : name;
    for (const auto& e : t) {
      if (!e.is_object() || !e.contains("name") || !e["name"].is_string() || !e.contains("template") ||
          !e["template"].is_string()) {
        throw std::runtime_error(
            "tokenizer_config.json: \"chat_template\" list entries must be {\"name\": str, \"template\": str}");
      }
      const auto n = e["name"].get<std::string>();
      if (n == want) return e["template"].get<std::string>();
      names += (names.empty() ? "" : ", ") + n;
    }
    throw std::runtime_error("tokenizer_config.json: no chat template named '" + std::string(want) +
                             "' (have: " + names + ")");
  }
  throw std::runtime_error(std::string("tokenizer_config.json: \"chat_template\" must be a string or a list, got ") +
                           t.type_name());
}

std::string load_chat_template_source(const std::filesystem::path& dir, std::string_view name) {
  const auto jinja = dir / "chat_template.jinja";
  if (std::filesystem::exists(jinja)) return read_text(jinja);
  const auto config_path = dir / "tokenizer_config.json";
  if (!std::filesystem::exists(config_path)) {
    throw std::runtime_error("no chat template in " + dir.string() +
                             ": expected chat_template.jinja or tokenizer_config.json");
  }
  nlohmann::json config;
  try {
    config = nlohmann::json::parse(read_text(config_path));
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error(config_path.string() + ": invalid JSON: " + e.what());
  }
  try {
    return chat_template_from_config(config, name);
  } catch (const std::runtime_error& e) {
    throw std::runtime_error(config_path.string() + ": " + e.what());
  }
}

std::optional<std::string> special_token(const nlohmann::json& config, std::string_view key) {
  if (!config.is_object()) return std::nullopt;
  const auto it = config.find(std::string(key));
  if (it == config.end() || it->is_null()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) return (*it)["content"].get<std::string>();
  return std::nullopt;
}

}  // namespace servedeck::worker
