// JSON helpers that never throw on outside input (the gateway's request path has no exceptions).
#pragma once

#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace servedeck::policies {

/// Compact serialisation; invalid UTF-8 is replaced with U+FFFD instead of throwing.
inline std::string dump_safe(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

/// obj[key] when obj is an object and that member is a string; otherwise "". (json::value()
/// throws when the member exists with another type.)
inline std::string string_field(const nlohmann::json& obj, std::string_view key) {
  if (!obj.is_object()) return {};
  auto it = obj.find(key);
  if (it == obj.end() || !it->is_string()) return {};
  return it->get<std::string>();
}

}  // namespace servedeck::policies
