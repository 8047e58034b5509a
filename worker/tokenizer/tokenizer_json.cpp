#include "worker/tokenizer/tokenizer_json.hpp"

#include "worker/tokenizer/tokenizer.hpp"

namespace servedeck::worker {
namespace {

using json = nlohmann::json;

// SAX handler: forwards every event to nlohmann's DOM builder except the values of
// root.model.vocab and root.model.merges, which it collects itself.
class Sax {
 public:
  Sax(TokenizerJson& out, const std::string& origin) : out_(out), origin_(origin), dom_(out.rest, true) {}

  bool null() { return capturing() ? scalar("null") : dom_.null(); }
  bool boolean(bool v) { return capturing() ? scalar(v ? "true" : "false") : dom_.boolean(v); }
  bool number_integer(json::number_integer_t v) { return capturing() ? integer(v, std::to_string(v)) : dom_.number_integer(v); }
  bool number_unsigned(json::number_unsigned_t v) {
    return capturing() ? integer(v > INT64_MAX ? -1 : static_cast<std::int64_t>(v), std::to_string(v)) : dom_.number_unsigned(v);
  }
  bool number_float(json::number_float_t v, const json::string_t& s) { return capturing() ? scalar(s) : dom_.number_float(v, s); }
  bool binary(json::binary_t& v) { return capturing() ? scalar("(binary)") : dom_.binary(v); }
  bool string(json::string_t& v) {
    if (!capturing()) return dom_.string(v);
    if (capture_ == Capture::merges && depth_ == capture_depth_ + 1) {  // "left right"
      const std::size_t sp = v.find(' ');
      if (sp == std::string::npos || v.find(' ', sp + 1) != std::string::npos)
        fail(merge_field(), "expected \"left right\" (two tokens separated by one space), got \"" + v + "\"");
      out_.merges.emplace_back(v.substr(0, sp), v.substr(sp + 1));
      return true;
    }
    if (capture_ == Capture::merges && depth_ == capture_depth_ + 2) {  // element of [left, right]
      if (pair_count_ >= 2) fail(merge_field(), "expected [left, right], got more than two elements");
      (pair_count_ == 0 ? out_.merges.back().first : out_.merges.back().second) = v;
      ++pair_count_;
      return true;
    }
    return scalar("\"" + v + "\"");
  }
  bool start_object(std::size_t n) {
    if (!capturing()) {
      ++depth_;
      stack_keys_.emplace_back();
      return dom_.start_object(n);
    }
    if (capture_ == Capture::vocab && depth_ == capture_depth_) {
      ++depth_;
      out_.vocab.reserve(n == static_cast<std::size_t>(-1) ? 0 : n);
      return true;
    }
    return scalar("an object");
  }
  bool key(json::string_t& k) {
    if (capture_ == Capture::vocab) {
      vocab_key_ = k;
      return true;
    }
    if (depth_ == 2 && stack_keys_.size() == 2 && stack_keys_[0] == "model" && (k == "vocab" || k == "merges")) {
      capture_ = k == "vocab" ? Capture::vocab : Capture::merges;
      capture_depth_ = depth_;
      (capture_ == Capture::vocab ? out_.has_vocab : out_.has_merges) = true;
      return true;
    }
    stack_keys_.back() = k;
    return dom_.key(k);
  }
  bool end_object() {
    if (capture_ == Capture::vocab && depth_ == capture_depth_ + 1) {
      --depth_;
      capture_ = Capture::none;
      return true;
    }
    --depth_;
    stack_keys_.pop_back();
    return dom_.end_object();
  }
  bool start_array(std::size_t n) {
    if (!capturing()) {
      ++depth_;
      stack_keys_.emplace_back();
      return dom_.start_array(n);
    }
    if (capture_ == Capture::merges && depth_ == capture_depth_) {
      ++depth_;
      out_.merges.reserve(n == static_cast<std::size_t>(-1) ? 0 : n);
      return true;
    }
    if (capture_ == Capture::merges && depth_ == capture_depth_ + 1) {
      ++depth_;
      out_.merges.emplace_back();
      pair_count_ = 0;
      return true;
    }
    return scalar("an array");
  }
  bool end_array() {
    if (capture_ == Capture::merges && depth_ == capture_depth_ + 2) {
      if (pair_count_ != 2) fail(merge_field(out_.merges.size() - 1), "expected [left, right], got " + std::to_string(pair_count_) + " strings");
      --depth_;
      return true;
    }
    if (capture_ == Capture::merges && depth_ == capture_depth_ + 1) {
      --depth_;
      capture_ = Capture::none;
      return true;
    }
    --depth_;
    stack_keys_.pop_back();
    return dom_.end_array();
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) {
    throw TokenizerError(origin_ + ": not valid JSON: " + e.what());
  }

 private:
  enum class Capture { none, vocab, merges };
  bool capturing() const { return capture_ != Capture::none; }

  // A value where the captured structure has no place for it.
  bool scalar(const std::string& what) {
    if (capture_ == Capture::vocab && depth_ == capture_depth_ + 1)
      fail("model.vocab[\"" + vocab_key_ + "\"]", "expected a non-negative integer id, got " + what);
    if (capture_ == Capture::vocab) fail("model.vocab", "expected an object of token -> id, got " + what);
    if (depth_ == capture_depth_) fail("model.merges", "expected an array, got " + what);
    fail(merge_field(), "expected \"left right\" or [left, right], got " + what);
  }
  bool integer(std::int64_t v, const std::string& text) {
    if (capture_ == Capture::vocab && depth_ == capture_depth_ + 1 && v >= 0 && v <= INT32_MAX) {
      out_.vocab.emplace_back(vocab_key_, static_cast<std::int32_t>(v));
      return true;
    }
    return scalar(text);
  }
  std::string merge_field() const { return merge_field(out_.merges.size() - (depth_ == capture_depth_ + 2 ? 1 : 0)); }
  static std::string merge_field(std::size_t i) { return "model.merges[" + std::to_string(i) + "]"; }
  [[noreturn]] void fail(const std::string& field, const std::string& what) const {
    throw TokenizerError(origin_ + ": " + field + ": " + what);
  }

  TokenizerJson& out_;
  const std::string& origin_;
  nlohmann::detail::json_sax_dom_parser<json> dom_;
  Capture capture_ = Capture::none;
  std::size_t depth_ = 0;          // nesting depth of the document (captured containers included)
  std::size_t capture_depth_ = 0;  // depth_ when the captured key was read
  std::vector<std::string> stack_keys_;  // last key per open DOM container
  std::string vocab_key_;
  int pair_count_ = 0;
};

}  // namespace

TokenizerJson parse_tokenizer_json(std::string_view text, const std::string& origin) {
  TokenizerJson out;
  Sax sax(out, origin);
  try {
    json::sax_parse(text.begin(), text.end(), &sax);
  } catch (const json::exception& e) {
    throw TokenizerError(origin + ": not valid JSON: " + e.what());
  }
  return out;
}

}  // namespace servedeck::worker
