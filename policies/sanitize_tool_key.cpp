// sanitize_tool_tags on argument keys and tool names (declared in sanitize_tool_tags.hpp):
// markup removed from a key, and whether the key swallowed the next key/value (G02).
#include "policies/sanitize_tool_tags.hpp"
#include "policies/tag_markup.hpp"

namespace servedeck::policies {

using markup::TagKind;

KeyRepair repair_key(std::string_view key) {
  KeyRepair r;
  std::string_view k = key;
  // A leading fragment that ends a tag ("_key>", ">"), left by a tag split across tokens.
  std::size_t lead = 0;
  for (auto tag : markup::kTags) {
    for (std::size_t n = tag.size() - 1; n > lead; --n) {
      if (k.substr(0, n) == tag.substr(tag.size() - n)) {
        lead = n;
        break;
      }
    }
  }
  if (lead > 0) {
    k.remove_prefix(lead);
    r.changed = true;
  }
  // A trailing fragment that starts a tag ("<", "</arg_k"), however short.
  for (std::size_t s = 0; s < k.size(); ++s) {
    std::string_view frag = k.substr(s);
    if (frag.front() == '<' && markup::is_partial_tag(frag)) {
      // "<arg_k..." after text: the next key began here (G02)
      if (frag.size() >= 6 && std::string_view("<arg_key>").starts_with(frag) &&
          !markup::trim(k.substr(0, s)).empty()) {
        r.structural = true;
      }
      k = k.substr(0, s);
      r.changed = true;
      break;
    }
  }
  auto tags = markup::scan_tags(k);
  if (tags.empty() && !r.changed) {
    r.pieces.emplace_back(key);
    return r;
  }
  r.changed = true;
  std::size_t cursor = 0;
  bool text_seen = false;
  for (std::size_t t = 0; t <= tags.size(); ++t) {
    std::size_t end = t < tags.size() ? tags[t].pos : k.size();
    std::string_view text = markup::trim(k.substr(cursor, end - cursor));
    if (!text.empty()) {
      r.pieces.emplace_back(text);
      text_seen = true;
    }
    if (t < tags.size()) {
      if (text_seen && tags[t].kind == TagKind::open_key) r.structural = true;
      cursor = tags[t].pos + tags[t].len;
    }
  }
  if (r.pieces.size() >= 2) r.structural = true;
  return r;
}

std::optional<std::string> sanitize_tool_name(std::string_view name) {
  auto r = repair_key(name);
  if (!r.changed || r.pieces.size() != 1) return std::nullopt;
  return r.pieces.front();
}

}  // namespace servedeck::policies
