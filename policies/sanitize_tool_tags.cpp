#include "policies/sanitize_tool_tags.hpp"

#include "policies/json_util.hpp"
#include "policies/tag_markup.hpp"

namespace servedeck::policies {
namespace {

using json = nlohmann::json;
using markup::TagKind;

bool is_space(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

char decode_escape(std::string_view esc) {
  // esc is a complete escape: "\\n", "\\/", "\\u003c", ...
  if (esc.size() == 2) {
    switch (esc[1]) {
      case '"': return '"';
      case '\\': return '\\';
      case '/': return '/';
      case 'n': return '\n';
      case 't': return '\t';
      case 'r': return '\r';
      default: return '\x01';
    }
  }
  if (esc.size() == 6 && esc.substr(0, 4) == "\\u00") {
    int v = 0;
    for (char h : esc.substr(4)) {
      v *= 16;
      if (h >= '0' && h <= '9') v += h - '0';
      else if (h >= 'a' && h <= 'f') v += h - 'a' + 10;
      else if (h >= 'A' && h <= 'F') v += h - 'A' + 10;
      else return '\x01';
    }
    if (v >= 0x20 && v < 0x7f) return static_cast<char>(v);
    if (v == '\n' || v == '\t' || v == '\r') return static_cast<char>(v);
  }
  return '\x01';
}

bool escape_complete(std::string_view esc) {
  if (esc.size() < 2) return false;
  if (esc[1] == 'u') return esc.size() == 6;
  return true;
}

// Length of the suffix of `d`, starting at a '<', that is entirely (tag ws*)* followed by an
// optional partial tag: text that may still turn into a trailing edge of markup. 0 when none.
std::size_t trailing_candidate(std::string_view d, bool allow_partial) {
  for (std::size_t s = 0; s < d.size(); ++s) {
    if (d[s] != '<') continue;
    std::string_view x = d.substr(s);
    bool ok = false;
    while (true) {
      if (x.empty()) {
        ok = true;
        break;
      }
      if (std::size_t n = markup::complete_tag_at(x, 0); n > 0) {
        x.remove_prefix(n);
        while (!x.empty() && is_space(x.front())) x.remove_prefix(1);
        continue;
      }
      ok = allow_partial && markup::is_partial_tag(x);
      break;
    }
    if (ok) return d.size() - s;
  }
  return 0;
}

}  // namespace

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

ArgumentRepair::ArgumentRepair(const DeclaredTool* tool, ArgumentRepairOptions options)
    : tool_(tool), options_(options) {}

void ArgumentRepair::fail(std::string message) {
  if (!error_) error_ = std::move(message);
}

bool ArgumentRepair::top_expects_key() const {
  return !stack_.empty() && stack_.back() == '{' && expect_key_.back();
}

std::string ArgumentRepair::feed(std::string_view raw) {
  if (error_) return {};
  for (char ch : raw) {
    on_char(ch);
    if (error_) return {};
  }
  std::string out;
  if (options_.coerce) {
    held_ += pending_;
  } else {
    out = std::move(pending_);
  }
  pending_.clear();
  emitted_ += out;
  return out;
}

void ArgumentRepair::on_char(char ch) {
  if (!options_.sanitize) {
    emit(std::string_view(&ch, 1));
    return;
  }
  switch (mode_) {
    case Mode::structural:
      if (ch == '"') {
        if (top_expects_key()) {
          mode_ = Mode::key;
          string_raw_ = "\"";
        } else {
          mode_ = Mode::value;
          emit("\"");
          units_.clear();
          lead_resolved_ = false;
        }
        return;
      }
      if (ch == '{' || ch == '[') {
        stack_.push_back(ch);
        expect_key_.push_back(ch == '{');
      } else if ((ch == '}' || ch == ']') && !stack_.empty()) {
        stack_.pop_back();
        expect_key_.pop_back();
      } else if (ch == ',' && !stack_.empty() && stack_.back() == '{') {
        expect_key_.back() = true;
      } else if (ch == ':' && !stack_.empty()) {
        expect_key_.back() = false;
      }
      emit(std::string_view(&ch, 1));
      return;
    case Mode::key:
    case Mode::resplit_value:
      string_raw_.push_back(ch);
      if (!escape_.empty()) {
        escape_.push_back(ch);
        if (escape_complete(escape_)) escape_.clear();
        return;
      }
      if (ch == '\\') {
        escape_ = "\\";
        return;
      }
      if (ch == '"') {
        mode_ == Mode::key ? end_key() : end_resplit();
      }
      return;
    case Mode::resplit_colon:
      if (ch == ':') {
        expect_key_.back() = false;
      } else if (ch == '"') {
        mode_ = Mode::resplit_value;
        string_raw_ = "\"";
      } else if (!is_space(ch)) {
        fail("argument key '" + resplit_key_ + "' holds tool-call markup and its value is not a string");
      }
      return;
    case Mode::value:
      if (!escape_.empty()) {
        escape_.push_back(ch);
        if (escape_complete(escape_)) {
          Unit u{escape_, decode_escape(escape_)};
          escape_.clear();
          on_value_unit(std::move(u));
        }
        return;
      }
      if (ch == '\\') {
        escape_ = "\\";
        return;
      }
      if (ch == '"') {
        end_value();
        return;
      }
      on_value_unit(Unit{std::string(1, ch), ch});
      return;
  }
}

void ArgumentRepair::end_key() {
  mode_ = Mode::structural;
  auto decoded = parse_untrusted(string_raw_);
  if (decoded.is_discarded() || !decoded.is_string()) {
    emit(string_raw_);
    return;
  }
  const auto& key = decoded.get_ref<const std::string&>();
  KeyRepair r = repair_key(key);
  if (!r.changed) {
    emit(string_raw_);
    return;
  }
  sanitized_ = true;
  bool top = stack_.size() == 1;
  if (r.structural && top && options_.allow_resplit) {
    resplit_key_ = key;
    mode_ = Mode::resplit_colon;
    return;
  }
  if (r.pieces.empty()) {
    fail("argument key '" + key + "' is only tool-call markup");
    return;
  }
  std::string fixed = r.pieces.front();
  if (!r.structural) {
    fixed.clear();
    for (const auto& p : r.pieces) fixed += p;
  }
  if (top && tool_) {
    if (auto canon = tool_->canonical_key(fixed)) fixed = *canon;
  }
  emit(dump_safe(json(fixed)));
}

void ArgumentRepair::end_resplit() {
  mode_ = Mode::structural;
  expect_key_.back() = false;
  auto decoded = parse_untrusted(string_raw_);
  if (decoded.is_discarded() || !decoded.is_string()) {
    fail("argument value after key '" + resplit_key_ + "' is not a JSON string");
    return;
  }
  std::string what = "argument key '" + resplit_key_ + "' with value " + string_raw_;
  if (!tool_) {
    fail(what + " holds tool-call markup and the call names no declared tool to map it onto");
    return;
  }
  std::string text = "<arg_key>" + resplit_key_ + "</arg_key><arg_value>" +
                     decoded.get<std::string>() + "</arg_value>";
  auto pieces = markup::split_roles(text);
  std::vector<std::pair<std::string, json>> pairs;
  std::vector<std::string> lost;
  std::optional<std::string> key;
  for (auto& p : pieces) {
    if (p.role == markup::Piece::Role::key) {
      auto canon = tool_->canonical_key(p.text);
      if (!canon) {
        fail(what + ": fragment '" + p.text + "' is not a parameter of '" + tool_->name + "'");
        return;
      }
      if (key) lost.push_back(*key);
      key = *canon;
    } else if (p.role == markup::Piece::Role::value && key) {
      pairs.emplace_back(*key, typed_from_text(p.text, tool_->property(*key)));
      key.reset();
    } else {
      fail(what + ": fragment '" + p.text + "' has no key");
      return;
    }
  }
  if (key) lost.push_back(*key);
  for (const auto& l : lost) {
    for (const auto& req : tool_->required()) {
      if (req == l) {
        fail(what + ": the value of required parameter '" + l + "' was lost");
        return;
      }
    }
  }
  if (pairs.empty()) {
    fail(what + ": no key/value pair could be recovered");
    return;
  }
  std::string out;
  for (const auto& [k, v] : pairs) {
    if (!out.empty()) out += ",";
    out += dump_safe(json(k)) + ":" + dump_safe(v);
  }
  emit(out);
}

void ArgumentRepair::on_value_unit(Unit u) {
  units_.push_back(std::move(u));
  release_value(false);
}

void ArgumentRepair::release_value(bool closing) {
  std::string d;
  d.reserve(units_.size());
  for (const auto& u : units_) d.push_back(u.c);
  std::size_t drop_front = 0;
  if (!lead_resolved_) {
    std::size_t p = 0, strip_to = 0;
    while (true) {
      std::size_t q = p;
      while (q < d.size() && is_space(d[q])) ++q;
      std::size_t n = markup::complete_tag_at(d, q);
      if (n == 0) {
        p = q;
        break;
      }
      p = strip_to = q + n;
    }
    if (!closing && (p == d.size() || markup::is_partial_tag(std::string_view(d).substr(p)))) {
      return;  // may still become markup
    }
    lead_resolved_ = true;
    if (strip_to > 0) sanitized_ = true;
    drop_front = strip_to;
  }
  std::string_view rest = std::string_view(d).substr(drop_front);
  std::size_t keep = 0;
  if (closing) {
    keep = trailing_candidate(rest, false);
    std::size_t body_end = rest.size() - keep;
    // A damaged closing tag at the very end ("</arg_value" with no '>').
    if (keep == 0) {
      auto tags = markup::scan_tags(rest);
      if (!tags.empty() && !tags.back().complete && tags.back().pos + tags.back().len == rest.size() &&
          rest[tags.back().pos + 1] == '/') {
        body_end = tags.back().pos;
      }
    }
    if (body_end < rest.size()) sanitized_ = true;
    for (std::size_t i = drop_front; i < drop_front + body_end; ++i) emit(units_[i].raw);
    units_.clear();
    return;
  }
  keep = trailing_candidate(rest, true);
  std::size_t upto = drop_front + rest.size() - keep;
  for (std::size_t i = drop_front; i < upto; ++i) emit(units_[i].raw);
  units_.erase(units_.begin(), units_.begin() + static_cast<std::ptrdiff_t>(upto));
}

void ArgumentRepair::end_value() {
  release_value(true);
  emit("\"");
  mode_ = Mode::structural;
}

std::string ArgumentRepair::finish() {
  if (error_) return {};
  if (options_.sanitize) {
    if (mode_ == Mode::key) {
      emit(string_raw_);  // unterminated key: nothing better to do than pass it on
    } else if (mode_ == Mode::value) {
      for (const auto& u : units_) emit(u.raw);
      emit(escape_);
    } else if (mode_ == Mode::resplit_colon || mode_ == Mode::resplit_value) {
      fail("arguments ended inside a value whose key holds tool-call markup ('" + resplit_key_ + "')");
      return {};
    }
    units_.clear();
  }
  std::string out;
  if (options_.coerce) {
    out = held_ + pending_;
    held_.clear();
    auto j = parse_untrusted(out);
    if (!j.is_discarded() && j.is_object() && tool_) {
      bool changed = false;
      for (auto it = j.begin(); it != j.end(); ++it) {
        if (const json* schema = tool_->property(it.key())) {
          if (auto v = coerce_value(it.value(), *schema)) {
            it.value() = *v;
            changed = true;
          }
        }
      }
      if (changed) {
        coerced_ = true;
        out = dump_safe(j);
      }
    }
  } else {
    out = std::move(pending_);
  }
  pending_.clear();
  emitted_ += out;
  return out;
}

RepairedArguments repair_arguments(std::string_view arguments, const DeclaredTool* tool,
                                   ArgumentRepairOptions options) {
  ArgumentRepair r(tool, options);
  RepairedArguments out;
  out.text = r.feed(arguments);
  out.text += r.finish();
  out.error = r.error();
  out.sanitized = r.sanitized();
  out.coerced = r.coerced();
  return out;
}

}  // namespace servedeck::policies
