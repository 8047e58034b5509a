// `servedeck compare`: judges a change without trusting greedy text (operating notes,
// "Measuring a change": long-prompt prefill is not bit-deterministic, so greedy-text equivalence
// tests are invalid). Each fresh prompt goes through the baseline twice (fresh, then again —
// cached where the engine caches prefixes) and through the candidate once, with
// prompt_logprobs. Reported: top-1 agreement and KL(baseline ‖ other) per prompt position, for
// the candidate and for the baseline's own second run (its drift); the candidate passes when it
// stays within the baseline's drift plus a stated tolerance.
//
// KL is computed on the partition {each token in both top-k lists, everything else}: by the
// data-processing inequality this is a lower bound of the full-vocabulary KL, and it is exact
// when both engines return the same top-k set with the rest lumped.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace servedeck::tools {

struct CompareOptions {
  std::string baseline_host = "127.0.0.1";
  int baseline_port = 0;
  std::string baseline_model;
  std::string candidate_host = "127.0.0.1";
  int candidate_port = 0;
  std::string candidate_model;
  std::vector<std::string> prompts;  // empty: a built-in set of fresh prompts
  int top_logprobs = 5;
  double kl_tolerance = 1e-3;        // nats added to the drift's mean KL
  double agreement_tolerance = 0.01; // fraction subtracted from the drift's agreement
  int timeout_ms = 300000;
};

struct CompareStats {
  int positions = 0;
  double top1_agreement = 0;         // fraction of positions with the same argmax
  double mean_kl = 0;                // nats
  double max_kl = 0;
};

struct CompareReport {
  CompareStats candidate;            // candidate vs baseline (fresh)
  CompareStats drift;                // baseline (second run) vs baseline (fresh)
  bool pass = false;
  std::string table() const;
  nlohmann::json to_json() const;
};

/// One position's distribution: token id (as string) → logprob.
using PositionLogprobs = std::vector<std::pair<std::string, double>>;

/// KL(p ‖ q) on the partition described in the header comment; inputs are logprob lists.
double partition_kl(const PositionLogprobs& p, const PositionLogprobs& q);

/// Compares two prompt_logprobs arrays (vLLM shape: [null, {id: {logprob, rank, ...}}, ...]).
/// Accumulates into `stats`.
void accumulate(const nlohmann::json& base, const nlohmann::json& other, CompareStats& stats);

/// Runs the comparison. Throws std::runtime_error naming the engine call that failed.
CompareReport run_compare(const CompareOptions& opt);

}  // namespace servedeck::tools
