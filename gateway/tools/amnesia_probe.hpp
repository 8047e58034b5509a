// `servedeck probe amnesia`: the logprob probe from the operating notes ("Client
// compatibility"). Clients never echo reasoning_content, so a template renders earlier
// assistant turns with blank thinking and the model may conclude no task was ever given.
// The probe renders one conversation twice — as a client sends it (reasoning dropped) and with
// the reasoning restored — appends the tokens of a continuation prefix (default "The user"),
// asks the engine for one token with top-20 logprobs, and reports the probability mass on
// greeting-like continuations for both. The notes measured 3.32% → 0.00% on GLM
// (' wants' 51.9% → 99.97%).
//
// Talks to an engine (vLLM-compatible /tokenize and /v1/completions with token-id prompts),
// not to the gateway: the point is to see the prompt exactly as rendered.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace servedeck::tools {

struct AmnesiaOptions {
  std::string host = "127.0.0.1";
  int port = 0;
  std::string model;
  nlohmann::json messages;          // conversation ending on a tool result; assistant turns carry reasoning_content
  nlohmann::json tools = nlohmann::json::array();
  std::string continuation = "The user";
  int top_logprobs = 20;
  /// Continuation tokens counted as amnesia (compared after trimming leading spaces, lower-case).
  std::vector<std::string> greeting_tokens = {"has", "hasn", "just", "greeted", "greets", "greeting", "said",
                                              "says", "sent", "only", "didn", "hello", "hi"};
  int timeout_ms = 120000;
};

struct AmnesiaArm {
  std::string name;                 // "reasoning dropped" | "reasoning restored"
  int prompt_tokens = 0;
  double amnesia_mass = 0;          // probability mass on greeting-like continuations, [0, 1]
  std::vector<std::pair<std::string, double>> top;  // top continuations, probability
};

struct AmnesiaReport {
  AmnesiaArm dropped;
  AmnesiaArm restored;
  std::string table() const;
  nlohmann::json to_json() const;
};

/// A built-in agent conversation (task, reasoning + tool call, tool result) for the default probe.
nlohmann::json default_amnesia_conversation();

/// The conversation as a client sends it: reasoning_content / reasoning removed from every
/// assistant message.
nlohmann::json drop_reasoning(const nlohmann::json& messages);

/// Runs both arms. Throws std::runtime_error naming the request that failed and the engine's answer.
AmnesiaReport run_amnesia_probe(const AmnesiaOptions& opt);

}  // namespace servedeck::tools
