#include "worker/tokenizer/pre_tokenizer.hpp"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <nlohmann/json.hpp>

#include "worker/tokenizer/tokenizer.hpp"
#include "worker/tokenizer/utf8.hpp"

namespace servedeck::worker {
namespace {

// Unicode White_Space (PropList.txt), the set Rust's `\s`, Oniguruma's Unicode `\s` and
// char::is_whitespace use.
constexpr std::string_view k_white_space_items =
    "\\t\\n\\x{0B}\\f\\r\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}"
    "\\x{205F}\\x{3000}";

// GPT-2's split pattern, used by ByteLevel when use_regex is true.
constexpr std::string_view k_gpt2_pattern =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

struct MatchData {
  pcre2_match_data* md = pcre2_match_data_create(1, nullptr);
  ~MatchData() { pcre2_match_data_free(md); }
};

std::string escape_literal(std::string_view s) {
  std::string out = "\\Q";
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s.substr(i, 2) == "\\E") {
      out += "\\E\\\\E\\Q";
      ++i;
    } else {
      out.push_back(s[i]);
    }
  }
  out += "\\E";
  return out;
}

}  // namespace

const char* to_string(SplitBehavior b) {
  switch (b) {
    case SplitBehavior::removed: return "Removed";
    case SplitBehavior::isolated: return "Isolated";
    case SplitBehavior::merged_with_previous: return "MergedWithPrevious";
    case SplitBehavior::merged_with_next: return "MergedWithNext";
    case SplitBehavior::contiguous: return "Contiguous";
  }
  return "?";
}

std::string translate_whitespace_classes(std::string_view p) {
  std::string out;
  out.reserve(p.size() + 64);
  bool in_class = false;
  std::size_t class_start = 0;  // index in p just after '[' or '[^'
  for (std::size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char e = p[i + 1];
      if (e == 's') {
        out += in_class ? std::string(k_white_space_items) : "[" + std::string(k_white_space_items) + "]";
      } else if (e == 'S' && !in_class) {
        out += "[^" + std::string(k_white_space_items) + "]";
      } else {
        out.push_back(c);
        out.push_back(e);
      }
      ++i;
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out.push_back(c);
      if (i + 1 < p.size() && p[i + 1] == '^') {
        out.push_back('^');
        ++i;
      }
      class_start = i + 1;
      continue;
    }
    if (in_class && c == '[' && i + 1 < p.size() && p[i + 1] == ':') {  // POSIX [:name:]
      const std::size_t close = p.find(":]", i + 2);
      if (close != std::string_view::npos) {
        out.append(p.substr(i, close + 2 - i));
        i = close + 1;
        continue;
      }
    }
    if (in_class && c == ']' && i != class_start) in_class = false;
    out.push_back(c);
  }
  return out;
}

struct Regex::Impl {
  pcre2_code* code = nullptr;
  bool jit = false;
  ~Impl() { pcre2_code_free(code); }
};

Regex::Regex(std::string_view pattern, const std::string& where) : impl_(std::make_unique<Impl>()) {
  const std::string translated = translate_whitespace_classes(pattern);
  int err = 0;
  PCRE2_SIZE err_offset = 0;
  impl_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(),
                              PCRE2_UTF | PCRE2_UCP, &err, &err_offset, nullptr);
  if (impl_->code == nullptr) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof msg);
    throw TokenizerError(where + ": cannot compile regex '" + std::string(pattern) + "' (as '" + translated +
                         "'): " + reinterpret_cast<const char*>(msg) + " at offset " + std::to_string(err_offset));
  }
  impl_->jit = pcre2_jit_compile(impl_->code, PCRE2_JIT_COMPLETE) == 0;
}

Regex::Regex(Regex&&) noexcept = default;
Regex& Regex::operator=(Regex&&) noexcept = default;
Regex::~Regex() = default;

bool Regex::find(std::string_view text, std::size_t from, std::size_t& begin, std::size_t& end) const {
  thread_local MatchData data;
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  while (from < text.size()) {
    int rc = impl_->jit ? pcre2_jit_match(impl_->code, subject, text.size(), from, 0, data.md, nullptr)
                        : PCRE2_ERROR_JIT_BADOPTION;
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT || rc == PCRE2_ERROR_JIT_BADOPTION) {
      // note: the interpreter keeps its backtracking frames on the heap, so it copes with inputs
      // that exhaust JIT's 32 KiB default stack.
      rc = pcre2_match(impl_->code, subject, text.size(), from, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, data.md,
                       nullptr);
    }
    if (rc < 0) return false;  // no match, or a run-time limit: the rest is unmatched
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(data.md);
    if (ov[1] > ov[0]) {
      begin = ov[0];
      end = ov[1];
      return true;
    }
    // Empty match: step one code point and search again (the reference drops empty pieces).
    from = ov[0] + 1;
    while (from < text.size() && (static_cast<unsigned char>(text[from]) & 0xC0) == 0x80) ++from;
  }
  return false;
}

struct PreTokenizer::Step {
  enum class Kind { split, byte_level } kind = Kind::split;
  std::unique_ptr<Regex> regex;  // split, or byte_level with use_regex
  SplitBehavior behavior = SplitBehavior::isolated;
  bool invert = false;
  bool add_prefix_space = false;  // byte_level
};

namespace {

const nlohmann::json& require(const nlohmann::json& obj, const char* key, const std::string& where) {
  if (!obj.is_object() || !obj.contains(key)) throw TokenizerError(where + ": missing field '" + key + "'");
  return obj.at(key);
}

bool optional_bool(const nlohmann::json& obj, const char* key, bool fallback, const std::string& where) {
  if (!obj.contains(key) || obj.at(key).is_null()) return fallback;
  if (!obj.at(key).is_boolean()) throw TokenizerError(where + "." + key + ": expected a boolean, got " + obj.at(key).dump());
  return obj.at(key).get<bool>();
}

SplitBehavior parse_behavior(const nlohmann::json& v, const std::string& where) {
  const std::string s = v.is_string() ? v.get<std::string>() : v.dump();
  if (s == "Removed") return SplitBehavior::removed;
  if (s == "Isolated") return SplitBehavior::isolated;
  if (s == "MergedWithPrevious") return SplitBehavior::merged_with_previous;
  if (s == "MergedWithNext") return SplitBehavior::merged_with_next;
  if (s == "Contiguous") return SplitBehavior::contiguous;
  throw TokenizerError(where + ": unknown behavior " + s +
                       " (expected Removed, Isolated, MergedWithPrevious, MergedWithNext or Contiguous)");
}

void add_steps(const nlohmann::json& cfg, const std::string& where, std::vector<PreTokenizer::Step>& steps);

}  // namespace

namespace {
void add_steps(const nlohmann::json& cfg, const std::string& where, std::vector<PreTokenizer::Step>& steps) {
  const auto& type_v = require(cfg, "type", where);
  const std::string type = type_v.is_string() ? type_v.get<std::string>() : type_v.dump();
  if (type == "Sequence") {
    const auto& list = require(cfg, "pretokenizers", where);
    if (!list.is_array()) throw TokenizerError(where + ".pretokenizers: expected an array");
    for (std::size_t i = 0; i < list.size(); ++i)
      add_steps(list[i], where + ".pretokenizers[" + std::to_string(i) + "]", steps);
  } else if (type == "Split") {
    PreTokenizer::Step s;
    const auto& pat = require(cfg, "pattern", where);
    if (pat.is_object() && pat.contains("Regex") && pat.at("Regex").is_string()) {
      s.regex = std::make_unique<Regex>(pat.at("Regex").get<std::string>(), where + ".pattern.Regex");
    } else if (pat.is_object() && pat.contains("String") && pat.at("String").is_string()) {
      s.regex = std::make_unique<Regex>(escape_literal(pat.at("String").get<std::string>()), where + ".pattern.String");
    } else {
      throw TokenizerError(where + ".pattern: expected {\"Regex\": string} or {\"String\": string}, got " + pat.dump());
    }
    s.behavior = parse_behavior(require(cfg, "behavior", where), where + ".behavior");
    s.invert = optional_bool(cfg, "invert", false, where);
    steps.push_back(std::move(s));
  } else if (type == "ByteLevel") {
    PreTokenizer::Step s;
    s.kind = PreTokenizer::Step::Kind::byte_level;
    s.add_prefix_space = optional_bool(cfg, "add_prefix_space", true, where);
    if (optional_bool(cfg, "use_regex", true, where)) s.regex = std::make_unique<Regex>(k_gpt2_pattern, where + " (GPT-2 pattern)");
    steps.push_back(std::move(s));
  } else {
    throw TokenizerError(where + ".type: unsupported pre-tokenizer '" + type + "' (supported: Sequence, Split, ByteLevel)");
  }
}
}  // namespace

PreTokenizer::PreTokenizer(const nlohmann::json& config, const std::string& origin) {
  if (!config.is_null()) add_steps(config, origin + ": pre_tokenizer", steps_);
}

PreTokenizer::PreTokenizer(PreTokenizer&&) noexcept = default;
PreTokenizer& PreTokenizer::operator=(PreTokenizer&&) noexcept = default;
PreTokenizer::~PreTokenizer() = default;

void PreTokenizer::split(std::string_view text, WordSink& sink) const { run(0, text, sink); }

void PreTokenizer::run(std::size_t step, std::string_view text, WordSink& sink) const {
  if (text.empty()) return;
  if (step == steps_.size()) {
    sink.word(text);
    return;
  }
  const Step& s = steps_[step];
  if (s.kind == Step::Kind::byte_level) {
    if (s.add_prefix_space && text.front() != ' ') {
      std::string spaced = " ";
      spaced.append(text);
      if (s.regex == nullptr) return run(step + 1, spaced, sink);
      // Recurse on the spaced copy through the GPT-2 split below.
      std::size_t pos = 0, b = 0, e = 0;
      while (s.regex->find(spaced, pos, b, e)) {
        if (b > pos) run(step + 1, std::string_view(spaced).substr(pos, b - pos), sink);
        run(step + 1, std::string_view(spaced).substr(b, e - b), sink);
        pos = e;
      }
      if (pos < spaced.size()) run(step + 1, std::string_view(spaced).substr(pos), sink);
      return;
    }
    if (s.regex == nullptr) return run(step + 1, text, sink);
    std::size_t pos = 0, b = 0, e = 0;
    while (s.regex->find(text, pos, b, e)) {
      if (b > pos) run(step + 1, text.substr(pos, b - pos), sink);
      run(step + 1, text.substr(b, e - b), sink);
      pos = e;
    }
    if (pos < text.size()) run(step + 1, text.substr(pos), sink);
    return;
  }
  if (s.behavior == SplitBehavior::isolated) {  // hot path: no intermediate list
    std::size_t pos = 0, b = 0, e = 0;
    while (s.regex->find(text, pos, b, e)) {
      if (b > pos) run(step + 1, text.substr(pos, b - pos), sink);
      run(step + 1, text.substr(b, e - b), sink);
      pos = e;
    }
    if (pos < text.size()) run(step + 1, text.substr(pos), sink);
    return;
  }
  // General path (Hugging Face NormalizedString::split): list (range, is_delimiter), invert flips
  // which parts are delimiters, then the behavior decides what becomes a piece.
  struct Part {
    std::size_t b, e;
    bool delim;
  };
  std::vector<Part> parts;
  std::size_t pos = 0, b = 0, e = 0;
  while (s.regex->find(text, pos, b, e)) {
    if (b > pos) parts.push_back({pos, b, false});
    parts.push_back({b, e, true});
    pos = e;
  }
  if (pos < text.size()) parts.push_back({pos, text.size(), false});
  if (s.invert)
    for (auto& p : parts) p.delim = !p.delim;
  std::vector<Part> pieces;
  switch (s.behavior) {
    case SplitBehavior::isolated:
      pieces = parts;
      break;
    case SplitBehavior::removed:
      for (const auto& p : parts)
        if (!p.delim) pieces.push_back(p);
      break;
    case SplitBehavior::merged_with_previous: {
      bool prev_is_content = false;
      for (const auto& p : parts) {
        if (p.delim && prev_is_content && !pieces.empty()) {
          pieces.back().e = p.e;
        } else {
          pieces.push_back(p);
        }
        prev_is_content = !p.delim;
      }
      break;
    }
    case SplitBehavior::merged_with_next:
      // A delimiter joins the part after it when that part is not a delimiter.
      for (std::size_t i = 0; i < parts.size(); ++i) {
        if (parts[i].delim && i + 1 < parts.size() && !parts[i + 1].delim) {
          pieces.push_back({parts[i].b, parts[i + 1].e, false});
          ++i;
        } else {
          pieces.push_back(parts[i]);
        }
      }
      break;
    case SplitBehavior::contiguous: {
      bool prev_delim = false;
      for (const auto& p : parts) {
        if (p.delim == prev_delim && !pieces.empty()) {
          pieces.back().e = p.e;
        } else {
          pieces.push_back(p);
        }
        prev_delim = p.delim;
      }
      break;
    }
  }
  for (const auto& p : pieces) run(step + 1, text.substr(p.b, p.e - p.b), sink);
}

}  // namespace servedeck::worker
