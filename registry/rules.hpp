// The [[rules]] engine: known-bad settings as data (models.toml), evaluated by lint_registry
// against every entry (GPU unknown) and by preflight against the launched entry (GPU read).
//
// A rule:   [[rules]]  id, action ("refuse" | "warn"), reason (why, with the measured figure)
//           [rules.match] — every key present must hold (AND):
//   engine  = "vllm" | ["vllm", ...]          engine kind of the entry
//   model   = "glm53" | [...]                 table key of the entry
//   gpu_cc  = 120 | [100, 120] | {cond}       CUDA compute capability ×10 (SM120 → 120);
//                                             unknown (lint, no GPU) counts as matching and says so
//   env.NAME = cond                           environment value the entry sets
//   arg."--flag" = cond                       value after --flag (or --flag=value); "" for a bare flag
//   field.NAME = cond                         an entry key (cpu_offload_gib, pins_host_memory, ...)
//   any = [match, ...] / all = [match, ...] / not = match
// A cond is a string (equals), a number (eq), a bool (equals "true"/"false"), an array (in), or a
// table of operators, all of which must hold:
//   present / absent (bool), equals / not_equals (string), in / not_in (array), contains /
//   not_contains (string), eq ne lt le gt ge (number, or the name of a numeric entry field such as
//   "load_floor_offload_gib"), json = "key.path" (read the value as JSON and take that member first),
//   raw = true (match the text as written in models.toml, before placeholders are filled).
// An absent value satisfies only `absent`, not_equals, not_in and not_contains.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "registry/model_entry.hpp"
#include "registry/registry.hpp"

namespace servedeck::registry {

/// What a rule is evaluated against.
struct RuleSubject {
  const ModelEntry* model = nullptr;
  std::vector<std::string> args;                 // rendered argv[1..]
  std::vector<std::string> raw_args;             // as written (placeholders unfilled)
  std::map<std::string, std::string> env;        // rendered
  std::map<std::string, std::string> raw_env;    // as written
  std::optional<int> gpu_cc;                     // e.g. 120; nullopt = unknown
};

/// Builds the subject for `m` (renders its launch at port m.port).
RuleSubject make_rule_subject(const ModelEntry& m, const ServerConfig& server, std::optional<int> gpu_cc);

/// A rule that matched, with what was read: `argv --max-num-batched-tokens = 4096 (rule: < 8192)`.
struct RuleHit {
  const Rule* rule = nullptr;
  std::string evidence;      // "; "-joined readings that made the rule match
  bool gpu_cc_assumed = false;  // matched only because the GPU is unknown
  /// "<evidence>: <reason>"
  std::string message() const;
};

/// Evaluates one rule; nullopt when it does not match.
std::optional<RuleHit> evaluate_rule(const Rule& rule, const RuleSubject& subject);
/// Every matching rule, in file order.
std::vector<RuleHit> evaluate_rules(const std::vector<Rule>& rules, const RuleSubject& subject);

/// Checks a match expression's grammar. Returns (JSON pointer inside the match, message) pairs.
std::vector<std::pair<std::string, std::string>> validate_match(const nlohmann::json& match);

/// Value of `flag` in argv: the next element (`--flag value`), the text after `=` (`--flag=value`),
/// or "" for a bare flag (followed by another --flag or last). The last occurrence wins.
std::optional<std::string> arg_value(const std::vector<std::string>& args, std::string_view flag);

/// A numeric or boolean entry field by key name, as text ("125", "true"); nullopt when unset or
/// unknown. Names: see rule_field_names().
std::optional<std::string> field_value(const ModelEntry& m, std::string_view name);
const std::vector<std::string>& rule_field_names();

}  // namespace servedeck::registry
