#include "policies/tool_schema.hpp"

#include <cctype>

#include "common/json_limits.hpp"

namespace servedeck::policies {
namespace {

using json = nlohmann::json;

std::string fold(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    if (c == '-') c = '_';
    out.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
  }
  return out;
}

std::vector<std::string> types_of(const json& schema) {
  std::vector<std::string> out;
  if (!schema.is_object() || !schema.contains("type")) return out;
  const auto& t = schema["type"];
  if (t.is_string()) out.push_back(t.get<std::string>());
  if (t.is_array()) {
    for (const auto& e : t) {
      if (e.is_string()) out.push_back(e.get<std::string>());
    }
  }
  return out;
}

std::optional<json> convert(const std::string& s, std::string_view type) {
  if (type == "integer" || type == "number" || type == "boolean" || type == "null" ||
      type == "array" || type == "object") {
    auto j = parse_untrusted(s);
    if (j.is_discarded()) return std::nullopt;
    if (type == "integer" && j.is_number_integer()) return j;
    if (type == "integer" && j.is_number_float()) {
      double d = j.get<double>();
      if (d == static_cast<double>(static_cast<int64_t>(d))) return json(static_cast<int64_t>(d));
      return std::nullopt;
    }
    if (type == "number" && j.is_number()) return j;
    if (type == "boolean" && j.is_boolean()) return j;
    if (type == "null" && j.is_null()) return j;
    if (type == "array" && j.is_array()) return j;
    if (type == "object" && j.is_object()) return j;
  }
  return std::nullopt;
}

}  // namespace

std::vector<std::string> DeclaredTool::required() const {
  std::vector<std::string> out;
  if (parameters.is_object() && parameters.contains("required") && parameters["required"].is_array()) {
    for (const auto& r : parameters["required"]) {
      if (r.is_string()) out.push_back(r.get<std::string>());
    }
  }
  return out;
}

const json* DeclaredTool::property(std::string_view name) const {
  if (!parameters.is_object() || !parameters.contains("properties")) return nullptr;
  const auto& props = parameters["properties"];
  if (!props.is_object()) return nullptr;
  auto it = props.find(std::string(name));
  return it == props.end() ? nullptr : &*it;
}

std::optional<std::string> DeclaredTool::canonical_key(std::string_view key, WorkBudget* budget) const {
  if (!parameters.is_object() || !parameters.contains("properties") || !parameters["properties"].is_object())
    return std::nullopt;
  const auto& props = parameters["properties"];
  charge(budget, props.size() + key.size());
  std::string k = fold(key);
  for (auto it = props.begin(); it != props.end(); ++it) {
    const std::string& name = it.key();
    if (name.size() != k.size()) continue;  // folding keeps the length
    if (!charge(budget, name.size())) return std::nullopt;
    if (fold(name) == k) return name;
  }
  return std::nullopt;
}

std::vector<DeclaredTool> declared_tools(const json& request) {
  std::vector<DeclaredTool> out;
  if (!request.is_object() || !request.contains("tools") || !request["tools"].is_array()) return out;
  for (const auto& t : request["tools"]) {
    if (!t.is_object() || !t.contains("function") || !t["function"].is_object()) continue;
    const auto& f = t["function"];
    if (!f.contains("name") || !f["name"].is_string()) continue;
    DeclaredTool d;
    d.name = f["name"].get<std::string>();
    if (f.contains("parameters") && f["parameters"].is_object()) d.parameters = f["parameters"];
    out.push_back(std::move(d));
  }
  return out;
}

const DeclaredTool* find_tool(const std::vector<DeclaredTool>& tools, std::string_view name, WorkBudget* budget) {
  charge(budget, tools.size());
  for (const auto& t : tools) {
    if (t.name.size() != name.size()) continue;
    if (!charge(budget, name.size())) return nullptr;
    if (t.name == name) return &t;
  }
  return nullptr;
}

std::optional<json> coerce_value(const json& value, const json& schema, WorkBudget* budget) {
  if (!value.is_string()) return std::nullopt;
  auto types = types_of(schema);
  for (const auto& t : types) {
    if (t == "string") return std::nullopt;
  }
  const auto& s = value.get_ref<const std::string&>();
  for (const auto& t : types) {
    if (!charge(budget, s.size() + 1)) return std::nullopt;
    if (auto v = convert(s, t)) return v;
  }
  return std::nullopt;
}

json typed_from_text(const std::string& text, const json* schema, WorkBudget* budget) {
  if (schema) {
    if (auto v = coerce_value(json(text), *schema, budget)) return *v;
  }
  return json(text);
}

}  // namespace servedeck::policies
