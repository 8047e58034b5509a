#include "policies/tag_markup.hpp"

#include <algorithm>

#include <nlohmann/json.hpp>

#include "policies/json_util.hpp"

namespace servedeck::policies::markup {
namespace {

constexpr TagKind kKinds[] = {TagKind::open_tool_call, TagKind::close_tool_call, TagKind::open_key,
                              TagKind::close_key,      TagKind::open_value,      TagKind::close_value};

constexpr std::string_view kNames[] = {"tool_call", "arg_key", "arg_value"};

// note: a damaged tag needs at least 3 name characters ("<arg", "<too") so that ordinary text
// such as "a<b" or "</a>" is never taken for markup.
constexpr std::size_t kMinDamagedName = 3;

bool is_space(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

TagKind kind_of(std::string_view name, bool closing) {
  if (name == "tool_call") return closing ? TagKind::close_tool_call : TagKind::open_tool_call;
  if (name == "arg_key") return closing ? TagKind::close_key : TagKind::open_key;
  return closing ? TagKind::close_value : TagKind::open_value;
}

}  // namespace

std::string_view to_string(TagKind k) {
  switch (k) {
    case TagKind::open_tool_call: return "open_tool_call";
    case TagKind::close_tool_call: return "close_tool_call";
    case TagKind::open_key: return "open_key";
    case TagKind::close_key: return "close_key";
    case TagKind::open_value: return "open_value";
    case TagKind::close_value: return "close_value";
    case TagKind::unknown: break;
  }
  return "unknown";
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

std::size_t complete_tag_at(std::string_view s, std::size_t pos, TagKind* kind) {
  if (pos >= s.size() || s[pos] != '<') return 0;
  for (std::size_t i = 0; i < std::size(kTags); ++i) {
    if (s.substr(pos, kTags[i].size()) == kTags[i]) {
      if (kind) *kind = kKinds[i];
      return kTags[i].size();
    }
  }
  return 0;
}

bool is_partial_tag(std::string_view s) {
  if (s.empty()) return false;
  for (auto tag : kTags) {
    if (s.size() < tag.size() && tag.substr(0, s.size()) == s) return true;
  }
  return false;
}

std::vector<TagToken> scan_tags(std::string_view s) {
  std::vector<TagToken> out;
  std::size_t i = 0;
  while (i < s.size()) {
    if (s[i] != '<') {
      ++i;
      continue;
    }
    TagKind k{};
    if (std::size_t n = complete_tag_at(s, i, &k); n > 0) {
      out.push_back({i, n, k, true});
      i += n;
      continue;
    }
    bool closing = i + 1 < s.size() && s[i + 1] == '/';
    std::size_t name_start = i + 1 + (closing ? 1 : 0);
    std::size_t name_len = 0;
    while (name_start + name_len < s.size()) {
      char c = s[name_start + name_len];
      if (!((c >= 'a' && c <= 'z') || c == '_')) break;
      ++name_len;
    }
    std::string_view name = s.substr(name_start, name_len);
    int matches = 0;
    std::string_view matched;
    if (name.size() >= kMinDamagedName) {
      for (auto full : kNames) {
        if (full.substr(0, name.size()) == name) {
          ++matches;
          matched = full;
        }
      }
    }
    if (matches == 0) {
      ++i;
      continue;
    }
    std::size_t len = name_start + name_len - i;
    bool gt = name_start + name_len < s.size() && s[name_start + name_len] == '>';
    if (gt) ++len;
    out.push_back({i, len, matches == 1 ? kind_of(matched, closing) : TagKind::unknown, false});
    i += len;
  }
  return out;
}

std::vector<Piece> split_roles(std::string_view s) {
  auto tags = scan_tags(s);
  std::vector<Piece> out;
  std::size_t cursor = 0;
  for (std::size_t t = 0; t <= tags.size(); ++t) {
    std::size_t end = t < tags.size() ? tags[t].pos : s.size();
    std::string_view text = trim(s.substr(cursor, end - cursor));
    if (!text.empty()) {
      TagKind before = t > 0 ? tags[t - 1].kind : TagKind::unknown;
      TagKind after = t < tags.size() ? tags[t].kind : TagKind::unknown;
      Piece p;
      p.text = std::string(text);
      if (after == TagKind::close_key) p.role = Piece::Role::key;
      else if (after == TagKind::close_value) p.role = Piece::Role::value;
      else if (before == TagKind::open_key) p.role = Piece::Role::key;
      else if (before == TagKind::open_value || before == TagKind::close_key) p.role = Piece::Role::value;
      out.push_back(std::move(p));
    }
    if (t < tags.size()) cursor = tags[t].pos + tags[t].len;
  }
  return out;
}

std::vector<Block> find_blocks(std::string_view text) {
  constexpr std::string_view open = "<tool_call>";
  constexpr std::string_view close = "</tool_call>";
  std::vector<Block> out;
  std::size_t pos = 0;
  while ((pos = text.find(open, pos)) != std::string_view::npos) {
    std::size_t body = pos + open.size();
    std::size_t end = text.find(close, body);
    if (end == std::string_view::npos) break;
    out.push_back({pos, end + close.size(), std::string(text.substr(body, end - body))});
    pos = end + close.size();
  }
  return out;
}

namespace {

/// The next position of `tag` in `s` at or after `from`, cached: each tag is searched forward
/// only, so reading a body is linear however its tags are missing or repeated.
struct NextTag {
  std::string_view s, tag;
  std::size_t at = 0;
  bool searched = false;
  std::size_t from(std::size_t pos) {
    if (!searched || (at != std::string_view::npos && at < pos)) {
      at = s.find(tag, pos);
      searched = true;
    }
    return at;
  }
};

/// Qwen3-Coder's form: <function=NAME> then <parameter=KEY>VALUE</parameter>… then </function>.
/// A value ends at "</parameter>" or, missing that, at the next "<parameter=" or "</function>"
/// or the end (vLLM's qwen3_coder reading); one leading and one trailing newline are dropped.
ParsedCall parse_xml_function(std::string_view b) {
  constexpr std::string_view fopen = "<function=", popen = "<parameter=", pclose = "</parameter>", fclose = "</function>";
  constexpr std::size_t max_name = 256;
  ParsedCall call;
  const std::size_t gt = b.find('>', fopen.size());
  if (gt == std::string_view::npos || gt - fopen.size() > max_name) return call;
  call.name = std::string(trim(b.substr(fopen.size(), gt - fopen.size())));
  if (call.name.empty() || call.name.find_first_of("<>\n{}\" ") != std::string::npos) return call;
  NextTag next_open{b, popen}, next_close{b, pclose}, next_end{b, fclose};
  std::size_t pos = gt + 1;
  for (;;) {
    const std::size_t p = next_open.from(pos);
    const std::size_t e = next_end.from(pos);
    if (p == std::string_view::npos || (e != std::string_view::npos && e < p)) {
      // No further parameter: only whitespace may remain around </function>.
      const std::string_view rest = e == std::string_view::npos ? b.substr(pos) : b.substr(pos, e - pos);
      if (!trim(rest).empty()) return call;
      if (e != std::string_view::npos && !trim(b.substr(e + fclose.size())).empty()) return call;
      break;
    }
    if (!trim(b.substr(pos, p - pos)).empty()) return call;  // stray text between parameters
    const std::size_t kgt = b.find('>', p + popen.size());
    if (kgt == std::string_view::npos || kgt - p - popen.size() > max_name) return call;
    std::string key(trim(b.substr(p + popen.size(), kgt - p - popen.size())));
    if (key.empty()) return call;
    const std::size_t v0 = kgt + 1;
    std::size_t v1 = std::min({next_close.from(v0), next_open.from(v0), next_end.from(v0), b.size()});
    std::string_view value = b.substr(v0, v1 - v0);
    if (!value.empty() && value.front() == '\n') value.remove_prefix(1);
    if (!value.empty() && value.back() == '\n') value.remove_suffix(1);
    call.glm_args.emplace_back(std::move(key), std::string(value));
    pos = v1 < b.size() && b.substr(v1, pclose.size()) == pclose ? v1 + pclose.size() : v1;
  }
  call.ok = true;
  return call;
}

}  // namespace

ParsedCall parse_block_body(std::string_view body) {
  ParsedCall call;
  std::string_view b = trim(body);
  if (b.substr(0, 10) == "<function=") return parse_xml_function(b);
  if (!b.empty() && b.front() == '{') {
    auto j = parse_untrusted(b);
    if (j.is_discarded() || !j.is_object() || !j.contains("name") || !j["name"].is_string()) return call;
    call.name = j["name"].get<std::string>();
    const auto& args = j.contains("arguments") ? j["arguments"]
                       : j.contains("parameters") ? j["parameters"] : nlohmann::json::object();
    if (args.is_string()) call.json_arguments = args.get<std::string>();
    else if (args.is_object()) call.json_arguments = dump_safe(args);
    else return call;
    call.ok = !call.name.empty();
    return call;
  }
  // GLM form: the name runs up to the first tag (or the end: a call without arguments).
  auto tags = scan_tags(b);
  std::size_t name_end = tags.empty() ? b.size() : tags.front().pos;
  call.name = std::string(trim(b.substr(0, name_end)));
  if (call.name.empty() || call.name.find_first_of("<>\n{}\" ") != std::string::npos) return call;
  auto pieces = split_roles(b.substr(name_end));
  std::optional<std::string> key;
  for (auto& p : pieces) {
    if (p.role == Piece::Role::key) {
      if (key) return call;  // a key without a value: not a complete call
      key = p.text;
    } else if (p.role == Piece::Role::value && key) {
      call.glm_args.emplace_back(*key, p.text);
      key.reset();
    } else {
      return call;
    }
  }
  if (key) return call;
  call.ok = true;
  return call;
}

std::size_t stray_think_close(std::string_view s) {
  std::size_t close = s.find(kThinkClose);
  if (close == std::string_view::npos) return close;
  if (s.substr(0, close).find(kThinkOpen) != std::string_view::npos) return std::string_view::npos;
  return close;
}

}  // namespace servedeck::policies::markup
