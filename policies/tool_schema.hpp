// The tools a request declares, read from its `tools` array (OpenAI function tools), and typing
// of argument values by JSON-schema type. Used by sanitize_tool_tags (schema spelling, G02
// re-split), tool_call_repair (G03/G04/G05/G07) and answer_rescue (declared-tool check).
//
// Pure functions; thread-safe.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "policies/work_budget.hpp"

namespace servedeck::policies {

/// One declared function tool. `parameters` is the JSON schema (an object schema), or an empty
/// object schema when the tool declared none.
struct DeclaredTool {
  std::string name;
  nlohmann::json parameters = nlohmann::json::object();

  /// `required`, filtered to strings.
  std::vector<std::string> required() const;
  /// The schema of property `name`, or nullptr.
  const nlohmann::json* property(std::string_view name) const;
  /// The declared spelling of `key` when it matches a property ignoring case and '-'/'_'
  /// ("Path" → "path", "max-results" → "max_results"); nullopt when none does. Charges `budget`
  /// one step per property plus the bytes compared.
  std::optional<std::string> canonical_key(std::string_view key, WorkBudget* budget = nullptr) const;
};

/// The function tools of a chat-completion request body (`tools[].function`); empty when none.
/// Entries that are not function tools, or have no string name, are skipped.
std::vector<DeclaredTool> declared_tools(const nlohmann::json& request);

/// The tool named `name` in `tools`, or nullptr. Charges `budget` one step per tool plus the
/// bytes compared.
const DeclaredTool* find_tool(const std::vector<DeclaredTool>& tools, std::string_view name,
                              WorkBudget* budget = nullptr);

/// Converts `value` to the JSON-schema `type` of `schema` when it is a string that spells a value
/// of that type exactly: "10" → 10 (integer), "2.5" → 2.5 (number), "true" → true (boolean),
/// "null" → null, "[1]" → [1] (array), "{...}" → object. `type` may be a list; the first type
/// the string converts to wins, and a string stays a string when "string" is allowed. A string
/// that parse_untrusted refuses (nested deeper than k_max_json_depth) stays a string. Returns
/// nullopt when nothing changes. Charges `budget` the string's bytes per type tried.
std::optional<nlohmann::json> coerce_value(const nlohmann::json& value, const nlohmann::json& schema,
                                           WorkBudget* budget = nullptr);

/// Types a raw markup value (GLM `<arg_value>` text) by schema: the schema says string → the text;
/// otherwise coerce_value of the text, falling back to the text.
nlohmann::json typed_from_text(const std::string& text, const nlohmann::json* schema, WorkBudget* budget = nullptr);

}  // namespace servedeck::policies
