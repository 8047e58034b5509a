// Tool-call markup as GLM-style chat templates write it, and a tolerant reader for it.
//
// The six tags `<tool_call>`, `</tool_call>`, `<arg_key>`, `</arg_key>`, `<arg_value>`,
// `</arg_value>` are never valid inside an argument key. Engines' streaming tool parsers leak
// them into parsed arguments when a tag straddles a token boundary (seed notes, "Client
// compatibility": list_dir({"path</arg_key>": ...})). This file recognises complete and partial
// tags; sanitize_tool_tags, tool_call_repair and answer_rescue build on it.
//
// All functions are pure and thread-safe.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace servedeck::policies::markup {

/// Which tag; `unknown` for a partial tag whose name is ambiguous ("<arg_" could open either).
enum class TagKind { open_tool_call, close_tool_call, open_key, close_key, open_value, close_value, unknown };

/// "open_tool_call", "close_key", ... ("unknown").
std::string_view to_string(TagKind k);

/// The tag names, e.g. "<arg_key>".
inline constexpr std::string_view kTags[] = {"<tool_call>", "</tool_call>", "<arg_key>",
                                             "</arg_key>",  "<arg_value>",  "</arg_value>"};

/// Length of the complete tag starting at `s[pos]`, or 0.
std::size_t complete_tag_at(std::string_view s, std::size_t pos, TagKind* kind = nullptr);

/// True when `s` is a non-empty proper prefix of some tag ("<", "</arg_k"): it may still grow
/// into a tag.
bool is_partial_tag(std::string_view s);

/// A tag found by the tolerant scanner: complete, or damaged (missing '>' or truncated), e.g.
/// "<arg_key" in `file<arg_key`. `kind` is unknown when the fragment fits several tags.
struct TagToken {
  std::size_t pos = 0;
  std::size_t len = 0;
  TagKind kind = TagKind::unknown;
  bool complete = false;
};

/// Scans `s` for tags, tolerating damaged ones: "<" optional "/" then a prefix (≥ 3 chars) of
/// "tool_call" / "arg_key" / "arg_value", then an optional ">". Text between tokens is text.
std::vector<TagToken> scan_tags(std::string_view s);

/// One text piece of tolerant markup with its inferred role.
struct Piece {
  enum class Role { key, value, unknown } role = Role::unknown;
  std::string text;  // trimmed of surrounding whitespace
};

/// Splits markup like "file</arg_key><arg_value>a.txt</arg_value>" into roles: a text followed
/// by a closing key tag is a key, followed by a closing value tag a value; otherwise the opening
/// tag before it decides. Empty (whitespace-only) texts are skipped.
std::vector<Piece> split_roles(std::string_view s);

/// A `<tool_call>…</tool_call>` block found in free text: [begin, end) in the text, body between
/// the tags.
struct Block {
  std::size_t begin = 0;
  std::size_t end = 0;
  std::string body;
};

/// Every complete block in `text`, in order.
std::vector<Block> find_blocks(std::string_view text);

/// A tool call read out of a block body, any of three forms:
///   hermes:      {"name": "read", "arguments": {"file": "a"}}
///   GLM:         read<arg_key>file</arg_key><arg_value>a</arg_value>   (tolerant: missing tags)
///   Qwen3-Coder: <function=read>\n<parameter=file>\na\n</parameter>\n</function>
///                (tolerant: a missing </parameter> ends the value at the next tag, as vLLM reads it)
/// `glm_args` holds raw strings for the GLM and Qwen3-Coder forms (typing is the caller's job, by
/// schema). Linear in the body.
struct ParsedCall {
  std::string name;
  std::vector<std::pair<std::string, std::string>> glm_args;  // GLM / Qwen3-Coder form: key → raw text
  std::optional<std::string> json_arguments;                  // hermes form: arguments as JSON text
  bool ok = false;                                            // false when the roles did not pair up
};
ParsedCall parse_block_body(std::string_view body);

/// Position of the first "</think>" in `s` that has no "<think>" before it, or npos.
std::size_t stray_think_close(std::string_view s);

inline constexpr std::string_view kThinkOpen = "<think>";
inline constexpr std::string_view kThinkClose = "</think>";

/// Trims ASCII whitespace at both ends.
std::string_view trim(std::string_view s);

}  // namespace servedeck::policies::markup
