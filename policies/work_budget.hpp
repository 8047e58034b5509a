// The per-request work budget of the policies.
//
// Every repair and streaming transducer is linear in its input, but the inputs are hostile and
// some work is a product of two of them (each tool call looked up among every declared tool,
// each empty call searched for in all the streamed text). So the transducers count their work in
// steps — one step per byte a loop examines or per entry a lookup visits — on the budget of the
// request they serve, and stop once it is spent. The allowance grows with the input: each
// request body, response body or streamed chunk grants k_steps_per_byte steps per byte of its
// text, on top of k_base_steps. A request that spends its budget ends with a clear error naming
// the limit (the request side: HTTP 400; the response side: 502 or the stream's error event),
// never a stuck proxy thread.
//
// Thread-safety: one budget per request, used by one thread at a time.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace servedeck::policies {

/// The `code` of the error a request gets when its policies spend their budget.
inline constexpr std::string_view k_work_budget_code = "policy_work_budget_exceeded";

class WorkBudget {
 public:
  /// note: the transducers spend at most 12 steps per input byte on the 1 MiB adversarial
  /// inputs of tests/policies/linear_time_test.cpp (whitespace runs, half tags, tag runs, nested
  /// brackets, unterminated strings; request, response and stream side); 64 leaves 5x room.
  static constexpr std::uint64_t k_steps_per_byte = 64;
  /// Steps allowed on top, whatever the input's size: 4 Mi, a few milliseconds of work.
  static constexpr std::uint64_t k_base_steps = 4u << 20;

  WorkBudget() = default;
  /// A budget with other rates (tests that exercise the exhausted path).
  WorkBudget(std::uint64_t steps_per_byte, std::uint64_t base_steps)
      : steps_per_byte_(steps_per_byte), base_steps_(base_steps) {}

  /// Adds the allowance for `bytes` more bytes of input.
  void grant(std::uint64_t bytes) { input_bytes_ += bytes; }

  /// Spends `steps`. Returns false once the budget is exhausted (and from then on).
  bool charge(std::uint64_t steps) {
    steps_ += steps;
    return !exhausted();
  }

  bool exhausted() const { return steps_ > limit(); }

  /// Steps spent so far.
  std::uint64_t steps() const { return steps_; }
  /// Input bytes granted so far.
  std::uint64_t input_bytes() const { return input_bytes_; }
  /// The most steps allowed now: steps_per_byte × input_bytes + base_steps.
  std::uint64_t limit() const { return steps_per_byte_ * input_bytes_ + base_steps_; }

  /// "servedeck: the policies stopped after 268435460 steps, over this request's work budget of
  /// 268435456 steps (64 per byte of its 4128768 input bytes + 4194304); the input makes a repair
  /// loop over the same text again and again".
  std::string message() const;

 private:
  std::uint64_t steps_per_byte_ = k_steps_per_byte;
  std::uint64_t base_steps_ = k_base_steps;
  std::uint64_t input_bytes_ = 0;
  std::uint64_t steps_ = 0;
};

/// Charges `steps` to `budget` when there is one; true while it is not exhausted.
inline bool charge(WorkBudget* budget, std::uint64_t steps) { return budget == nullptr || budget->charge(steps); }

/// The text bytes of a JSON value: string and key bytes plus one per value. What a request body,
/// a response body or a chunk grants. Iterative (an explicit stack, no recursion), linear.
std::uint64_t json_text_bytes(const nlohmann::json& j);

}  // namespace servedeck::policies
