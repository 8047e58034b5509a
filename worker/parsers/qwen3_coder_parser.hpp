// The Qwen3-Coder tool-call format (--tool-parser qwen3_coder), the XML its chat template asks for:
//   <tool_call>
//   <function=NAME>
//   <parameter=KEY>
//   VALUE
//   </parameter>
//   …
//   </function>
//   </tool_call>
// A value is the text between "<parameter=KEY>" and "</parameter>" (or the next "<parameter=",
// "</function>" or "</tool_call>", as vLLM's qwen3_coder parser reads a missing close tag), less
// one leading and one trailing newline. Values are typed by the tool's JSON schema
// (qwen3_coder_value). Streaming: the call starts once "<function=NAME>" is complete; each
// completed parameter is one arguments fragment ({"k": v, then , "k2": v2, then }).
//
// Not thread-safe: one parser per completion.
#pragma once

#include <memory>
#include <string_view>

#include <nlohmann/json.hpp>

#include "worker/parsers/tool_call_parser.hpp"

namespace servedeck::worker {

/// The JSON value of parameter `key` of function `function` written as `text` (the value with
/// its newlines already stripped), typed by the type its schema declares in `tools` (the
/// request's OpenAI "tools" array; null or malformed → every value a string), as vLLM's
/// qwen3_coder parser does:
///   "null" (any case)                            → null, for every type
///   no schema for the key, no "type", or a string type (string, str, text, varchar, char,
///   enum)                                        → the text verbatim
///   int…, uint…, long…, short…, unsigned…        → an integer when the text is one, else the text
///   num…, float…                                 → a number (integral values as integers) when
///                                                  the text parses whole as a finite number, else the text
///   boolean, bool, binary                        → true / false for "true" / "false" (any case),
///                                                  else the text (vLLM answers false there)
///   object, array, arr, dict…, list…, other types → the text parsed as JSON, else the text
/// A "type" given as a list takes its first entry other than "null". Never throws.
nlohmann::json qwen3_coder_value(const nlohmann::json& tools, std::string_view function, std::string_view key,
                                 std::string_view text);

/// A qwen3_coder parser; `tools` as above (copied), `ids` names the calls.
std::unique_ptr<ToolCallParser> make_qwen3_coder_parser(const nlohmann::json& tools, ToolCallIdGenerator ids);

}  // namespace servedeck::worker
