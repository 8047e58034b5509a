// Stop strings over streamed text: the text a stop string starts is never emitted, even when the
// stop string spans several tokens. Text that could be the start of a stop string is held back
// until the next piece decides it. Also: holding back an incomplete UTF-8 sequence at the end of
// the token bytes, so no emitted piece splits a character.
//
// Not thread-safe: one per request.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace servedeck::worker {

class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stops);
  /// Consumes text; returns what may be emitted now. After a match, stopped() is true, the
  /// returned text ends right before the stop string, and further pushes return "".
  std::string push(std::string_view text);
  /// End of generation without a match: releases held text.
  std::string flush();
  bool stopped() const { return stopped_; }
  /// The stop string that matched (empty when none).
  const std::string& matched() const { return matched_; }

 private:
  std::vector<std::string> stops_;
  std::string held_;
  std::string matched_;
  bool stopped_ = false;
};

/// Accumulates raw token bytes and releases only complete UTF-8 sequences.
class Utf8Holdback {
 public:
  std::string push(std::string_view bytes);
  std::string flush();

 private:
  std::string pending_;
};

}  // namespace servedeck::worker
