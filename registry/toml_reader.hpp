// Typed, validating access to one toml++ table, collecting diagnostics instead of stopping at the
// first problem. Internal to servedeck_registry.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>
#include <toml++/toml.h>

#include "registry/registry.hpp"

namespace servedeck::registry::detail {

/// Collects diagnostics for one file.
struct DiagnosticSink {
  std::string file;
  std::vector<Diagnostic> diagnostics;
  void error(int line, std::string key, std::string message);
  void warning(int line, std::string key, std::string message);
  bool has_errors() const;
};

/// 1-based line of a node; 0 when unknown.
int line_of(const toml::node& n);
/// Short text of a value for messages: 400000, "abc", true, [..], {..}.
std::string show(const toml::node& n);
/// Levenshtein distance (for "did you mean").
std::size_t edit_distance(std::string_view a, std::string_view b);
/// The closest of `valid` to `key` when it is close enough to be a likely typo; "" otherwise.
std::string closest_key(std::string_view key, const std::vector<std::string>& valid);
/// Shortest text that round-trips `v`: 0.95, 125, 1e-05.
std::string format_number(double v);

/// Reads keys of one table. Construction reports every key not in `known` as an error naming the
/// closest valid key. Each accessor returns nullopt when the key is absent or has the wrong type
/// (the latter reported).
class TableReader {
 public:
  TableReader(const toml::table& t, std::string prefix, DiagnosticSink& sink, std::vector<std::string> known);

  const toml::table& table() const { return table_; }
  const std::string& prefix() const { return prefix_; }
  std::string key_path(std::string_view key) const;  // prefix + "." + key
  int line(std::string_view key) const;              // line of the key's value, else of the table
  bool has(std::string_view key) const { return table_.contains(key); }

  std::optional<std::string> string(std::string_view key);
  std::optional<bool> boolean(std::string_view key);
  /// Integer in [min, max]; `what` describes the unit for messages ("tokens").
  std::optional<int64_t> integer(std::string_view key, int64_t min, int64_t max, std::string_view what);
  /// Integer or float in the range; `min_exclusive` makes the lower bound open.
  std::optional<double> number(std::string_view key, double min, double max, bool min_exclusive,
                               std::string_view what);
  std::optional<std::vector<std::string>> string_array(std::string_view key);
  /// A table of string values (env). Integers and floats are rejected: env values are text.
  std::optional<std::map<std::string, std::string>> string_table(std::string_view key);
  const toml::table* subtable(std::string_view key);
  const toml::array* array(std::string_view key);

  /// Reports a wrong-type value.
  void type_error(std::string_view key, std::string_view expected);

 private:
  const toml::table& table_;
  std::string prefix_;
  DiagnosticSink& sink_;
};

/// toml → JSON. When `lines` is given, records the line of each node under its JSON pointer.
nlohmann::json to_json(const toml::node& n, std::map<std::string, int>* lines = nullptr,
                       const std::string& pointer = "");

}  // namespace servedeck::registry::detail
