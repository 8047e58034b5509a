// sanitize_tool_tags: strips tool-call markup that leaked into parsed tool-call arguments.
//
// What it repairs (seed notes, "Client compatibility"; field case G02): GLM's streaming tool
// parser can miss a closing tag that straddles a token boundary, and the tag then leaks into the
// parsed arguments, e.g. list_dir({"path</arg_key>": "/Users/user/Desktop/project"}). The client
// rejects the call. The six tags (markup::kTags) are never valid in an argument key, so:
//   - keys: every tag (complete or damaged) is removed; a repaired key that matches a declared
//     parameter ignoring case and '-'/'_' takes the schema's spelling;
//   - string values: tags are removed only at the edges (a literal tag inside free text, e.g. a
//     `new_string` being edited, survives);
//   - G02: a key that swallowed the next key/value (`{"file<arg_key": "page</arg_key><arg_value>5"}`)
//     is re-split by reading key and value as markup again, only when every recovered key is a
//     declared parameter; otherwise the call is reported unrecoverable (never forwarded).
//     A key whose value was lost in the corruption ("file" above) is dropped when optional; when
//     it is required the call is unrecoverable.
//
// ArgumentRepair is a streaming transducer over one tool call's `arguments` text: feed() takes
// raw fragments and returns repaired text that is safe to emit now (an argument key is held
// until its closing quote, a value's edges while they could still become markup). Invariant:
// the concatenation of feed() outputs and finish() equals the result of feeding the whole text
// at once, and every output is a prefix-extension of the earlier ones. The non-streaming path
// uses the same class, so both paths agree by construction. Linear time: each raw byte costs a
// bounded number of steps however the text is split (a value's held edge is tracked as a state,
// never re-scanned); the steps are charged to ArgumentRepairOptions::budget when one is given,
// and a spent budget makes the call unrecoverable (error()).
//
// Thread-safety: an ArgumentRepair is used by one thread.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "policies/tool_schema.hpp"
#include "policies/work_budget.hpp"

namespace servedeck::policies {

struct ArgumentRepairOptions {
  bool sanitize = false;       // sanitize_tool_tags
  bool coerce = false;         // G07: coerce values to declared types at the end; holds all output
  bool allow_resplit = true;   // G02 re-split; off → a structural key keeps its first piece
  WorkBudget* budget = nullptr;  // the request's work budget (steps charged here); none: unbounded
};

class ArgumentRepair {
 public:
  /// `tool` is the declared tool the call names (nullptr when unknown: no schema spelling, and a
  /// key that needs a re-split makes the call unrecoverable).
  ArgumentRepair(const DeclaredTool* tool, ArgumentRepairOptions options);

  /// Raw argument text in; repaired text that can be emitted now out (possibly empty).
  std::string feed(std::string_view raw);
  /// End of the call's arguments: the rest of the repaired text.
  std::string finish();

  /// Set when the call cannot be repaired (G02 fragments that do not map onto the schema); then
  /// feed()/finish() return nothing more.
  const std::optional<std::string>& error() const { return error_; }
  bool sanitized() const { return sanitized_; }   // some markup was removed or a key re-split
  bool coerced() const { return coerced_; }       // G07 changed some value's type
  const std::string& emitted() const { return emitted_; }  // everything returned so far

 private:
  enum class Mode { structural, key, value, resplit_colon, resplit_value };

  void on_char(char ch);
  void on_value_unit(std::string_view raw, char c);
  void scan_lead();
  void resolve_lead();
  void push_trailing(std::string_view raw, char c);
  void emit_held(std::size_t units);
  void end_key();
  void end_value();
  void end_resplit();
  void emit(std::string_view s) { pending_ += s; }
  void fail(std::string message);
  bool spend(std::uint64_t steps);
  bool top_expects_key() const;

  const DeclaredTool* tool_;
  ArgumentRepairOptions options_;
  Mode mode_ = Mode::structural;
  std::vector<char> stack_;          // '{' or '['
  std::vector<bool> expect_key_;     // per stack entry: object awaiting a key
  std::string string_raw_;           // key string raw text, or resplit value raw text
  std::string escape_;               // an escape sequence in progress ("\\u00")
  // The current string value's units not yet emitted (a unit: one raw character or one complete
  // escape sequence). While the leading edge is open they are the whole value so far, of the form
  // (ws* tag)* ws* [partial tag]; after it, the longest suffix that may still become trailing
  // markup: empty, or '<' … of the form (tag ws*)* [partial tag].
  std::string held_raw_;             // their raw JSON text, concatenated
  std::string held_chars_;           // one per unit: the decoded ASCII character, '\x01' for anything else
  std::string held_sizes_;           // one per unit: its raw length in bytes (1, 2 or 6)
  bool lead_resolved_ = false;       // the value's leading edge is known
  std::size_t lead_scan_ = 0;        // leading edge open: held units before this one are scanned
  std::size_t lead_strip_ = 0;       // leading edge open: units before this one are leading markup
  std::size_t partial_at_ = std::string::npos;  // leading edge known: the held unit where a partial tag starts
  std::string resplit_key_;          // decoded key awaiting its value (G02)
  std::string pending_;              // produced, not yet returned
  std::string held_;                 // coerce mode: everything produced
  std::string emitted_;
  std::optional<std::string> error_;
  bool sanitized_ = false;
  bool coerced_ = false;
};

/// The repaired key for `key` (markup removed) and whether it was structurally damaged (holds
/// more than one key's text). Exposed for tests.
struct KeyRepair {
  std::vector<std::string> pieces;  // texts between tags, trimmed, non-empty
  bool changed = false;
  bool structural = false;
};
KeyRepair repair_key(std::string_view key);

/// Strips markup from a tool name's edges ("<tool_call>read" → "read"). nullopt when unchanged.
std::optional<std::string> sanitize_tool_name(std::string_view name);

/// Whole-arguments convenience: runs ArgumentRepair over `arguments` in one piece.
struct RepairedArguments {
  std::string text;
  std::optional<std::string> error;
  bool sanitized = false;
  bool coerced = false;
};
RepairedArguments repair_arguments(std::string_view arguments, const DeclaredTool* tool,
                                   ArgumentRepairOptions options);

}  // namespace servedeck::policies
