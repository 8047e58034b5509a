// The top-level fields of a client's request body checked against the JSON types its API allows,
// so that a field of the wrong type is a 400 naming the field, what was expected and what was
// read, instead of being silently ignored (a "temperature": "x" that changes nothing) or failing
// later under another name. Header-only; used by the Responses and Messages translators.
#pragma once

#include <initializer_list>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

namespace servedeck {

/// JSON kinds a field may have; a rule ORs them.
enum JsonKinds : unsigned { k_json_string = 1, k_json_bool = 2, k_json_integer = 4, k_json_number = 8, k_json_array = 16, k_json_object = 32 };

/// One field and the kinds it may have.
struct FieldRule {
  const char* name;
  unsigned kinds;
};

/// The first mistyped field: its name, the kinds expected ("a string or an array") and the
/// kind read (nlohmann's type_name: "string", "number", "boolean", "array", "object").
struct FieldTypeError {
  std::string name, expected, got;
};

/// "a string or an array" for k_json_string | k_json_array.
inline std::string json_kinds_text(unsigned kinds) {
  static const std::pair<unsigned, const char*> k_names[] = {{k_json_string, "a string"},   {k_json_bool, "a boolean"},
                                                             {k_json_integer, "an integer"}, {k_json_number, "a number"},
                                                             {k_json_array, "an array"},    {k_json_object, "an object"}};
  std::string out;
  for (const auto& [k, name] : k_names)
    if (kinds & k) out += (out.empty() ? "" : " or ") + std::string(name);
  return out;
}

/// True when `v` is one of `kinds`.
inline bool json_has_kind(const nlohmann::json& v, unsigned kinds) {
  return ((kinds & k_json_string) && v.is_string()) || ((kinds & k_json_bool) && v.is_boolean()) ||
         ((kinds & k_json_integer) && v.is_number_integer()) || ((kinds & k_json_number) && v.is_number()) ||
         ((kinds & k_json_array) && v.is_array()) || ((kinds & k_json_object) && v.is_object());
}

/// The first field of `rules`, in their order, that `body` (an object) holds with a kind its rule
/// does not allow; a null field counts as absent. O(rules).
inline std::optional<FieldTypeError> first_mistyped_field(const nlohmann::json& body, std::initializer_list<FieldRule> rules) {
  for (const FieldRule& r : rules) {
    const auto it = body.find(r.name);
    if (it == body.end() || it->is_null() || json_has_kind(*it, r.kinds)) continue;
    return FieldTypeError{r.name, json_kinds_text(r.kinds), it->type_name()};
  }
  return std::nullopt;
}

}  // namespace servedeck
