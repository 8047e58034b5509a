#include "policies/work_budget.hpp"

#include <vector>

namespace servedeck::policies {

using json = nlohmann::json;

std::string WorkBudget::message() const {
  return "servedeck: the policies stopped after " + std::to_string(steps_) + " steps, over this request's work budget of " +
         std::to_string(limit()) + " steps (" + std::to_string(steps_per_byte_) + " per byte of its " +
         std::to_string(input_bytes_) + " input bytes + " + std::to_string(base_steps_) +
         "); the input makes a repair loop over the same text again and again";
}

std::uint64_t json_text_bytes(const json& j) {
  std::uint64_t bytes = 0;
  std::vector<const json*> pending{&j};
  while (!pending.empty()) {
    const json* v = pending.back();
    pending.pop_back();
    ++bytes;
    if (v->is_string()) {
      bytes += v->get_ref<const std::string&>().size();
    } else if (v->is_object()) {
      for (auto it = v->begin(); it != v->end(); ++it) {
        bytes += it.key().size();
        pending.push_back(&it.value());
      }
    } else if (v->is_array()) {
      for (const auto& e : *v) pending.push_back(&e);
    }
  }
  return bytes;
}

}  // namespace servedeck::policies
