#include "gateway/server/engine_chunk.hpp"

#include <cstdint>

#include "common/json_limits.hpp"
#include "gateway/server/request_notes.hpp"
#include "gateway/server/stream_normalizer.hpp"

namespace servedeck::gateway {

using nlohmann::json;

namespace {

/// `value` as the engine sent it, for an error message: JSON text, one line, bounded.
std::string quoted(const json& value) {
  // note: a value's text is at most one event (k_max_engine_event, 16 MiB) and is dumped once,
  // for the one error that ends the stream.
  return "'" + log_safe(dump_safe(value), k_max_quoted_event_bytes) + "'";
}

/// True when `v` is an integer (JSON integer syntax, not 1e18 or 1.0) in [0, limit).
bool index_in_range(const json& v, int64_t limit) {
  if (v.is_number_unsigned()) return v.get<uint64_t>() < static_cast<uint64_t>(limit);
  if (v.is_number_integer()) {
    const auto i = v.get<int64_t>();
    return i >= 0 && i < limit;
  }
  return false;
}

/// "" when `holder` has no `index` or an integer one in [0, limit); else the error message.
std::string check_index(const json& holder, const std::string& field, int64_t limit, const char* bound) {
  auto it = holder.find("index");
  if (it == holder.end() || index_in_range(*it, limit)) return {};
  return "the engine sent " + field + ".index = " + quoted(*it) + " (" + std::string(it->type_name()) +
         "); expected an integer in [0, " + std::to_string(limit) + ") (" + bound + ")";
}

}  // namespace

int64_t requested_choices(const json& request) {
  if (!request.is_object()) return 1;
  auto n = request.find("n");
  if (n == request.end()) return 1;
  if (n->is_number_unsigned()) {
    const auto v = n->get<uint64_t>();
    return v >= 1 && v <= static_cast<uint64_t>(INT64_MAX) ? static_cast<int64_t>(v) : 1;
  }
  if (n->is_number_integer() && n->get<int64_t>() >= 1) return n->get<int64_t>();
  return 1;
}

std::string engine_chunk_error(const json& chunk, const EngineChunkShape& shape) {
  const char* expected = shape.chat ? "expected a chat.completion.chunk: a JSON object with a \"choices\" array"
                                    : "expected a text_completion chunk: a JSON object with a \"choices\" array";
  if (!chunk.is_object())
    return "the engine sent an event that is not a completion chunk: read " + quoted(chunk) + " (" +
           std::string(chunk.type_name()) + "); " + expected;
  auto choices = chunk.find("choices");
  if (choices == chunk.end()) return {};  // a usage-only or timings-only tail
  if (!choices->is_array())
    return "the engine sent a chunk whose \"choices\" is not an array: read " + quoted(*choices) + " (" +
           std::string(choices->type_name()) + "); " + expected;
  const int64_t n = shape.choices < 1 ? 1 : shape.choices;
  std::size_t ci = 0;
  for (const auto& c : *choices) {
    const std::string at = "choices[" + std::to_string(ci++) + "]";
    if (!c.is_object())
      return "the engine sent " + at + " = " + quoted(c) + " (" + std::string(c.type_name()) +
             "); expected a choice object";
    if (auto bad = check_index(c, at, n, "the request's n"); !bad.empty()) return bad;
    if (!shape.chat) continue;
    auto delta = c.find("delta");
    if (delta == c.end() || !delta->is_object()) continue;
    auto calls = delta->find("tool_calls");
    if (calls == delta->end() || !calls->is_array()) continue;
    std::size_t ti = 0;
    for (const auto& tc : *calls) {
      const std::string tat = at + ".delta.tool_calls[" + std::to_string(ti++) + "]";
      if (!tc.is_object()) continue;
      if (auto bad = check_index(tc, tat, static_cast<int64_t>(k_max_stream_tool_calls), "k_max_stream_tool_calls");
          !bad.empty())
        return bad;
    }
  }
  return {};
}

}  // namespace servedeck::gateway
