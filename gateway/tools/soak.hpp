// `servedeck soak`: the agent-loop reproducer from the operating notes ("Stability: Xid 31"):
// one conversation regrown and re-sent in full each turn, streamed, with ~50 tool definitions
// and tool results appended, for N turns. The notes' reproducer faulted at turn ~33 with ~13k
// of context; this one rebuilds it from that description.
//
// A turn is ok only when its stream delivered content, reasoning or a tool call and ended
// properly (tools/stream_reader.hpp). Each turn also shows the prompt tokens and the cached
// ones the engine reports (a prefix cache at work: cached tokens grow with the conversation and
// TTFT stays flat). The soak stops at the first failed turn and names it:
// nothing after an engine's death is counted ok. Bounded in turns and wall time; it talks only
// to the address it is given (loopback by default).
#pragma once

#include <cstdint>
#include <iosfwd>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace servedeck::tools {

struct SoakOptions {
  std::string host = "127.0.0.1";
  int port = 8090;
  std::string model;               // id sent as `model`
  std::string api_key;
  int turns = 20;
  int tools = 50;                  // tool definitions sent every turn
  int max_tokens = 64;             // per turn
  int time_limit_s = 600;          // whole soak
  int gap_timeout_ms = 120000;     // longest silence inside one turn
  int tool_result_bytes = 600;     // size of each appended tool result
  /// Starts every turn's system prompt with the turn's number, so an engine can reuse no prefix
  /// of an earlier turn: the baseline a prefix cache is measured against (docs/performance.md).
  bool cold_prefix = false;
};

struct SoakTurn {
  int turn = 0;                    // 1-based
  int status = 0;                  // HTTP status
  bool ok = false;
  std::string failure;
  double ttft_ms = 0;
  double decode_tok_s = 0;
  /// From the stream's usage, when the engine reported it: prompt tokens, and of them the ones
  /// the engine reused from its prefix cache (usage.prompt_tokens_details.cached_tokens).
  std::optional<int64_t> prompt_tokens, cached_tokens;
  std::size_t messages = 0;        // messages sent this turn
  std::size_t request_bytes = 0;
};

struct SoakReport {
  std::vector<SoakTurn> turns;
  int ok_turns = 0;
  std::optional<int> failed_turn;  // first failed turn, when any
  bool time_limit_hit = false;
  /// One line per turn, then a summary line.
  std::string table() const;
  nlohmann::json to_json() const;
};

/// The synthetic tool set: `n` function tools with varied JSON schemas (deterministic).
nlohmann::json soak_tools(int n);

/// Runs the soak; prints one line per turn to `progress` when non-null.
SoakReport run_soak(const SoakOptions& opt, std::ostream* progress);

}  // namespace servedeck::tools
