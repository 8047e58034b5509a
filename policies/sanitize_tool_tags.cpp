#include "policies/sanitize_tool_tags.hpp"

#include "policies/json_util.hpp"
#include "policies/tag_markup.hpp"

namespace servedeck::policies {
namespace {

using json = nlohmann::json;

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

}  // namespace

ArgumentRepair::ArgumentRepair(const DeclaredTool* tool, ArgumentRepairOptions options)
    : tool_(tool), options_(options) {}

void ArgumentRepair::fail(std::string message) {
  if (!error_) error_ = std::move(message);
}

bool ArgumentRepair::spend(std::uint64_t steps) {
  if (charge(options_.budget, steps)) return true;
  fail(options_.budget->message());
  return false;
}

bool ArgumentRepair::top_expects_key() const {
  return !stack_.empty() && stack_.back() == '{' && expect_key_.back();
}

std::string ArgumentRepair::feed(std::string_view raw) {
  if (error_) return {};
  for (char ch : raw) {
    if (!spend(1)) return {};
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
          held_raw_.clear();
          held_chars_.clear();
          held_sizes_.clear();
          lead_resolved_ = false;
          lead_scan_ = lead_strip_ = 0;
          partial_at_ = std::string::npos;
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
          std::string esc = std::move(escape_);
          escape_.clear();
          on_value_unit(esc, decode_escape(esc));
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
      on_value_unit(std::string_view(&ch, 1), ch);
      return;
  }
}

void ArgumentRepair::end_key() {
  mode_ = Mode::structural;
  if (!spend(2 * string_raw_.size())) return;  // the parse and repair_key's scans
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
    if (auto canon = tool_->canonical_key(fixed, options_.budget)) fixed = *canon;
  }
  emit(dump_safe(json(fixed)));
}

void ArgumentRepair::end_resplit() {
  mode_ = Mode::structural;
  expect_key_.back() = false;
  if (!spend(3 * (string_raw_.size() + resplit_key_.size()))) return;  // parse, split_roles, re-serialise
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
      auto canon = tool_->canonical_key(p.text, options_.budget);
      if (options_.budget && options_.budget->exhausted()) {
        fail(options_.budget->message());
        return;
      }
      if (!canon) {
        fail(what + ": fragment '" + p.text + "' is not a parameter of '" + tool_->name + "'");
        return;
      }
      if (key) lost.push_back(*key);
      key = *canon;
    } else if (p.role == markup::Piece::Role::value && key) {
      pairs.emplace_back(*key, typed_from_text(p.text, tool_->property(*key), options_.budget));
      key.reset();
    } else {
      fail(what + ": fragment '" + p.text + "' has no key");
      return;
    }
  }
  if (key) lost.push_back(*key);
  const auto required = tool_->required();
  if (!spend(lost.size() * (required.size() + 1))) return;
  for (const auto& l : lost) {
    for (const auto& req : required) {
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

// A string value's edges, as a state machine over its units (one step each):
//   leading edge open   the units so far are (ws* tag)* ws* [partial tag]: held, since they may
//                       still be leading markup; lead_scan_ is how far they have been read.
//                       The first unit that breaks the form resolves the edge: the leading tags
//                       (and the whitespace before them) are dropped, the rest goes on below.
//   leading edge known  held = the longest suffix of the units that may still become trailing
//                       markup: empty, '<' + a partial tag (partial_at_ is where the partial
//                       starts), or (tag ws*)+ (partial_at_ == npos). A unit that breaks the form
//                       releases the held units (all of them, or all but a new '<').
void ArgumentRepair::on_value_unit(std::string_view raw, char c) {
  if (lead_resolved_) {
    push_trailing(raw, c);
    return;
  }
  held_raw_.append(raw);
  held_chars_.push_back(c);
  held_sizes_.push_back(static_cast<char>(raw.size()));
  scan_lead();
}

void ArgumentRepair::scan_lead() {
  const std::string_view d = held_chars_;
  while (true) {
    while (lead_scan_ < d.size() && is_space(d[lead_scan_])) {
      ++lead_scan_;
      if (!spend(1)) return;
    }
    if (lead_scan_ == d.size()) return;  // may still become markup
    if (!spend(markup::kTags[1].size())) return;  // one complete_tag_at / is_partial_tag probe
    if (std::size_t n = markup::complete_tag_at(d, lead_scan_); n > 0) {
      lead_scan_ += n;
      lead_strip_ = lead_scan_;
      continue;
    }
    if (markup::is_partial_tag(d.substr(lead_scan_))) return;  // may still become markup
    break;
  }
  resolve_lead();
}

void ArgumentRepair::resolve_lead() {
  lead_resolved_ = true;
  if (lead_strip_ > 0) sanitized_ = true;
  std::size_t raw_at = 0;
  for (std::size_t i = 0; i < lead_strip_; ++i) raw_at += static_cast<unsigned char>(held_sizes_[i]);
  std::string raw = held_raw_.substr(raw_at), chars = held_chars_.substr(lead_strip_),
              sizes = held_sizes_.substr(lead_strip_);
  if (!spend(held_chars_.size())) return;
  held_raw_.clear();
  held_chars_.clear();
  held_sizes_.clear();
  partial_at_ = std::string::npos;
  std::size_t at = 0;
  for (std::size_t i = 0; i < chars.size(); ++i) {
    std::size_t n = static_cast<unsigned char>(sizes[i]);
    push_trailing(std::string_view(raw).substr(at, n), chars[i]);
    at += n;
  }
}

void ArgumentRepair::push_trailing(std::string_view raw, char c) {
  if (!spend(1)) return;
  held_raw_.append(raw);
  held_chars_.push_back(c);
  held_sizes_.push_back(static_cast<char>(raw.size()));
  const std::size_t n = held_chars_.size();
  if (n == 1) {  // nothing was held
    if (c == '<') {
      partial_at_ = 0;
    } else {
      emit_held(n);
    }
    return;
  }
  if (partial_at_ != std::string::npos) {
    std::string_view p = std::string_view(held_chars_).substr(partial_at_);  // at most one tag long
    if (!spend(p.size())) return;
    if (markup::complete_tag_at(p, 0) == p.size()) {
      partial_at_ = std::string::npos;  // held = (tag ws*)+
    } else if (!markup::is_partial_tag(p)) {
      emit_held(c == '<' ? n - 1 : n);
      partial_at_ = c == '<' ? 0 : std::string::npos;
    }
    return;
  }
  // held = (tag ws*)+
  if (is_space(c)) return;
  if (c == '<') {
    partial_at_ = n - 1;
    return;
  }
  emit_held(n);
}

void ArgumentRepair::emit_held(std::size_t units) {
  std::size_t raw_len = 0;
  if (units == held_chars_.size()) {
    raw_len = held_raw_.size();
  } else {  // all but the last unit
    raw_len = held_raw_.size() - static_cast<unsigned char>(held_sizes_.back());
  }
  emit(std::string_view(held_raw_).substr(0, raw_len));
  held_raw_.erase(0, raw_len);
  held_chars_.erase(0, units);
  held_sizes_.erase(0, units);
}

void ArgumentRepair::end_value() {
  // At the closing quote: trailing markup is dropped — complete tags (and the whitespace after
  // them), or a damaged closing tag at the very end ("</arg_value" with no '>').
  std::string_view chars = held_chars_;
  std::size_t from = 0;  // the first held unit that is value text, not leading markup
  bool only_tags = false;
  if (!lead_resolved_) {
    lead_resolved_ = true;
    if (lead_strip_ > 0) sanitized_ = true;
    from = lead_strip_;
  } else {
    only_tags = !chars.empty() && partial_at_ == std::string::npos;
  }
  std::size_t body_end = chars.size();
  if (only_tags) {
    body_end = from;
  } else {
    std::string_view rest = chars.substr(from);
    if (spend(rest.size())) {
      auto tags = markup::scan_tags(rest);
      if (!tags.empty() && !tags.back().complete && tags.back().pos + tags.back().len == rest.size() &&
          rest[tags.back().pos + 1] == '/') {
        body_end = from + tags.back().pos;
      }
    }
  }
  if (body_end < chars.size()) sanitized_ = true;
  std::size_t raw_from = 0, raw_to = 0;
  for (std::size_t i = 0; i < body_end; ++i) {
    std::size_t n = static_cast<unsigned char>(held_sizes_[i]);
    if (i < from) raw_from += n;
    raw_to += n;
  }
  emit(std::string_view(held_raw_).substr(raw_from, raw_to - raw_from));
  held_raw_.clear();
  held_chars_.clear();
  held_sizes_.clear();
  emit("\"");
  mode_ = Mode::structural;
}

std::string ArgumentRepair::finish() {
  if (error_) return {};
  if (options_.sanitize) {
    if (mode_ == Mode::key) {
      emit(string_raw_);  // unterminated key: nothing better to do than pass it on
    } else if (mode_ == Mode::value) {
      emit(held_raw_);
      emit(escape_);
    } else if (mode_ == Mode::resplit_colon || mode_ == Mode::resplit_value) {
      fail("arguments ended inside a value whose key holds tool-call markup ('" + resplit_key_ + "')");
      return {};
    }
    held_raw_.clear();
    held_chars_.clear();
    held_sizes_.clear();
  }
  std::string out;
  if (options_.coerce) {
    out = held_ + pending_;
    held_.clear();
    if (!spend(2 * out.size())) return {};  // the parse and the re-serialisation
    auto j = parse_untrusted(out);
    if (!j.is_discarded() && j.is_object() && tool_) {
      bool changed = false;
      for (auto it = j.begin(); it != j.end(); ++it) {
        if (const json* schema = tool_->property(it.key())) {
          if (auto v = coerce_value(it.value(), *schema, options_.budget)) {
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
    if (options_.budget && options_.budget->exhausted()) {
      fail(options_.budget->message());
      return {};
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
