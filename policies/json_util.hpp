// JSON helpers that never throw on outside input (the gateway's request path has no exceptions).
// Parsing and serialising go through common/json_limits.hpp (parse_untrusted, dump_safe).
#pragma once

#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "common/json_limits.hpp"

namespace servedeck::policies {

/// obj[key] when obj is an object and that member is a string; otherwise "". (json::value()
/// throws when the member exists with another type.)
inline std::string string_field(const nlohmann::json& obj, std::string_view key) {
  if (!obj.is_object()) return {};
  auto it = obj.find(key);
  if (it == obj.end() || !it->is_string()) return {};
  return it->get<std::string>();
}

}  // namespace servedeck::policies
