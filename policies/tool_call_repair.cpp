#include "policies/tool_call_repair.hpp"

#include <algorithm>

#include <nlohmann/json.hpp>

#include "common/random_id.hpp"
#include "policies/json_util.hpp"
#include "policies/sanitize_tool_tags.hpp"
#include "policies/tag_markup.hpp"

namespace servedeck::policies {
namespace {

using json = nlohmann::json;

std::optional<std::string> arguments_from(const markup::ParsedCall& call, const DeclaredTool& tool, WorkBudget* budget) {
  json args = json::object();
  if (call.json_arguments) {
    if (!charge(budget, call.json_arguments->size())) return std::nullopt;
    args = parse_untrusted(*call.json_arguments);
    if (args.is_discarded() || !args.is_object()) return std::nullopt;
  } else {
    for (const auto& [k, v] : call.glm_args) {
      std::string key = tool.canonical_key(k, budget).value_or(k);
      args[key] = typed_from_text(v, tool.property(key), budget);
    }
  }
  std::string text = dump_safe(args);
  if (!charge(budget, text.size()) || !missing_required(text, tool, budget).empty()) return std::nullopt;
  return text;
}

std::optional<RecoveredCall> from_body(std::string_view body, std::size_t begin, std::size_t end,
                                       const std::vector<DeclaredTool>& tools,
                                       std::optional<std::string_view> name, WorkBudget* budget) {
  // note: parse_block_body trims, parses or scans for tags, and splits roles: four passes.
  if (!charge(budget, 4 * body.size())) return std::nullopt;
  auto parsed = markup::parse_block_body(body);
  if (!parsed.ok) return std::nullopt;
  if (name && parsed.name != *name) return std::nullopt;
  const DeclaredTool* tool = find_tool(tools, parsed.name, budget);
  if (!tool) return std::nullopt;
  auto args = arguments_from(parsed, *tool, budget);
  if (!args) return std::nullopt;
  return RecoveredCall{parsed.name, *args, begin, end};
}

}  // namespace

bool tool_call_repair_enabled(const registry::PolicyConfig& config) {
  if (config.extra.is_object() && config.extra.contains("tool_call_repair") &&
      config.extra["tool_call_repair"].is_boolean()) {
    return config.extra["tool_call_repair"].get<bool>();
  }
  return config.sanitize_tool_tags || config.coerce_tool_argument_types;
}

std::string new_tool_call_id() { return random_id("call"); }

NameResolution resolve_tool_name(std::string_view name, const std::vector<DeclaredTool>& tools, bool sanitize,
                                 WorkBudget* budget) {
  NameResolution r;
  std::string n(name);
  if (sanitize) {
    charge(budget, n.size());
    if (auto s = sanitize_tool_name(n)) {
      n = *s;
      r.sanitized = true;
    }
  }
  if (find_tool(tools, n, budget)) {
    r.name = n;
    return r;
  }
  int fits = 0;
  for (const auto& t : tools) {
    if (!charge(budget, 1)) break;
    if (n.size() <= t.name.size()) continue;
    if (!charge(budget, t.name.size()) || n.compare(0, t.name.size(), t.name) != 0) continue;
    if (!charge(budget, 2 * (n.size() - t.name.size()))) break;  // the property lookups of the rest
    std::string_view rest = std::string_view(n).substr(t.name.size());
    if (!rest.empty() && (rest.front() == '_' || rest.front() == '-' || rest.front() == '.') &&
        !t.property(rest)) {
      rest.remove_prefix(1);
    }
    if (t.property(rest)) {
      ++fits;
      r.name = t.name;
      r.split_param = std::string(rest);
    }
  }
  if (fits == 1) return r;
  r.name.clear();
  r.split_param.reset();
  std::string declared;
  for (const auto& t : tools) declared += (declared.empty() ? "" : ", ") + t.name;
  r.error = "tool call names '" + std::string(name) + "', which matches no declared tool (declared: " +
            declared + ")";
  return r;
}

std::string arguments_after_split(std::string_view arguments, const DeclaredTool& tool, const std::string& param,
                                  WorkBudget* budget) {
  std::string_view t = markup::trim(arguments);
  if (t.empty()) return "{}";
  charge(budget, 2 * arguments.size());
  auto j = parse_untrusted(t);
  if (!j.is_discarded() && j.is_object()) return std::string(arguments);
  json out = json::object();
  if (!j.is_discarded() && !j.is_string()) {
    out[param] = j;
  } else {
    std::string text = j.is_discarded() ? std::string(t) : j.get<std::string>();
    out[param] = typed_from_text(text, tool.property(param), budget);
  }
  return dump_safe(out);
}

bool is_empty_arguments(std::string_view arguments, WorkBudget* budget) {
  std::string_view t = markup::trim(arguments);
  if (t.empty()) return true;
  if (!charge(budget, t.size())) return false;
  auto j = parse_untrusted(t);
  return !j.is_discarded() && j.is_object() && j.empty();
}

std::vector<std::string> missing_required(std::string_view arguments, const DeclaredTool& tool, WorkBudget* budget) {
  auto req = tool.required();
  if (!charge(budget, arguments.size() + req.size())) return req;
  auto j = parse_untrusted(markup::trim(arguments));
  if (j.is_discarded() || !j.is_object()) return req;
  std::vector<std::string> out;
  for (const auto& r : req) {
    if (!j.contains(r)) out.push_back(r);
  }
  return out;
}

std::optional<RecoveredCall> recover_call(std::string_view text, const std::vector<DeclaredTool>& tools,
                                          std::optional<std::string_view> name, WorkBudget* budget) {
  if (!charge(budget, text.size())) return std::nullopt;
  for (const auto& b : markup::find_blocks(text)) {
    if (auto c = from_body(b.body, b.begin, b.end, tools, name, budget)) return c;
  }
  if (!name) return std::nullopt;
  if (!charge(budget, 3 * text.size())) return std::nullopt;  // the needle searches below
  // The name followed by argument markup, without (complete) block tags.
  std::string needle = std::string(*name) + "<arg_key>";
  std::size_t pos = text.find(needle);
  if (pos == std::string_view::npos) {
    needle = std::string(*name) + "\n<arg_key>";
    pos = text.find(needle);
  }
  if (pos == std::string_view::npos) return std::nullopt;
  std::size_t end = text.find("</tool_call>", pos);
  std::size_t body_end = end == std::string_view::npos ? text.size() : end;
  std::size_t range_end = end == std::string_view::npos ? text.size() : end + 12;
  std::size_t begin = pos;
  if (begin >= 11 && text.substr(begin - 11, 11) == "<tool_call>") begin -= 11;
  return from_body(text.substr(pos, body_end - pos), begin, range_end, tools, name, budget);
}

std::vector<RecoveredCall> extract_calls(std::string_view text, const std::vector<DeclaredTool>& tools,
                                         WorkBudget* budget) {
  std::vector<RecoveredCall> out;
  if (!charge(budget, text.size())) return out;
  for (const auto& b : markup::find_blocks(text)) {
    if (auto c = from_body(b.body, b.begin, b.end, tools, std::nullopt, budget)) out.push_back(std::move(*c));
  }
  return out;
}

std::string remove_ranges(std::string_view text, const std::vector<RecoveredCall>& calls) {
  std::vector<std::pair<std::size_t, std::size_t>> ranges;
  for (const auto& c : calls) ranges.emplace_back(c.begin, c.end);
  std::sort(ranges.begin(), ranges.end());
  std::string out;
  std::size_t cursor = 0;
  for (auto [b, e] : ranges) {
    if (b < cursor) continue;
    out += text.substr(cursor, b - cursor);
    cursor = e;
  }
  out += text.substr(std::min(cursor, text.size()));
  return std::string(markup::trim(out));
}

}  // namespace servedeck::policies
