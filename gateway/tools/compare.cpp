#include "gateway/tools/compare.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <sstream>
#include <stdexcept>

#include "common/json_limits.hpp"
#include "gateway/tools/engine_calls.hpp"

namespace servedeck::tools {

using nlohmann::json;

namespace {

PositionLogprobs position(const json& entry) {
  PositionLogprobs out;
  if (!entry.is_object()) return out;
  for (const auto& [id, v] : entry.items()) {
    if (v.is_object() && v.contains("logprob") && v["logprob"].is_number()) {
      out.emplace_back(id, v["logprob"].get<double>());
    } else if (v.is_number()) {
      out.emplace_back(id, v.get<double>());
    }
  }
  return out;
}

std::string argmax(const PositionLogprobs& p) {
  std::string best;
  double best_lp = -INFINITY;
  for (const auto& [id, lp] : p) {
    if (lp > best_lp) {
      best_lp = lp;
      best = id;
    }
  }
  return best;
}

json prompt_logprobs(const EngineAddress& at, const std::string& model, const std::string& prompt, int k) {
  json body = {{"model", model}, {"prompt", prompt}, {"max_tokens", 1}, {"temperature", 0}, {"prompt_logprobs", k}};
  json out = post_json(at, "/v1/completions", body);
  try {
    const json& pl = out.at("choices").at(0).at("prompt_logprobs");
    if (!pl.is_array()) throw std::runtime_error("not an array");
    return pl;
  } catch (const std::exception&) {
    throw std::runtime_error("POST /v1/completions with prompt_logprobs: expected choices[0].prompt_logprobs "
                             "(a list per prompt position), got " + dump_safe(out).substr(0, 300));
  }
}

std::vector<std::string> default_prompts() {
  return {
      "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
      "The quick brown fox jumps over the lazy dog. In 1925, the first",
      "SELECT name, COUNT(*) FROM orders JOIN customers ON orders.customer_id = customers.id GROUP BY",
      "Les modèles de langage de grande taille sont entraînés sur",
      "// Rust: parse a config file and return an error naming the line\nfn parse_config(text: &str) ->",
      "量子计算机利用量子比特进行计算，",
  };
}

}  // namespace

double partition_kl(const PositionLogprobs& p, const PositionLogprobs& q) {
  std::map<std::string, double> qmap;
  for (const auto& [id, lp] : q) qmap[id] = std::exp(lp);
  double p_rest = 1.0, q_rest = 1.0, kl = 0.0;
  for (const auto& [id, lp] : p) {
    auto it = qmap.find(id);
    if (it == qmap.end()) continue;  // lumped into "rest" on both sides
    double pp = std::exp(lp), qq = it->second;
    p_rest -= pp;
    q_rest -= qq;
    if (pp > 0 && qq > 0) kl += pp * (std::log(pp) - std::log(qq));
  }
  p_rest = std::max(p_rest, 0.0);
  q_rest = std::max(q_rest, 1e-12);
  if (p_rest > 1e-12) kl += p_rest * (std::log(p_rest) - std::log(q_rest));
  return std::max(kl, 0.0);
}

void accumulate(const json& base, const json& other, CompareStats& stats) {
  std::size_t n = std::min(base.size(), other.size());
  double kl_sum = stats.mean_kl * stats.positions;
  double agree = stats.top1_agreement * stats.positions;
  for (std::size_t i = 0; i < n; ++i) {
    PositionLogprobs p = position(base[i]);
    PositionLogprobs q = position(other[i]);
    if (p.empty() || q.empty()) continue;  // the first position has no logprobs
    double kl = partition_kl(p, q);
    kl_sum += kl;
    stats.max_kl = std::max(stats.max_kl, kl);
    if (argmax(p) == argmax(q)) agree += 1;
    ++stats.positions;
  }
  if (stats.positions > 0) {
    stats.mean_kl = kl_sum / stats.positions;
    stats.top1_agreement = agree / stats.positions;
  }
}

CompareReport run_compare(const CompareOptions& opt) {
  EngineAddress base{opt.baseline_host, opt.baseline_port, opt.timeout_ms};
  EngineAddress cand{opt.candidate_host, opt.candidate_port, opt.timeout_ms};
  CompareReport r;
  const std::vector<std::string> prompts = opt.prompts.empty() ? default_prompts() : opt.prompts;
  for (const auto& prompt : prompts) {
    json fresh = prompt_logprobs(base, opt.baseline_model, prompt, opt.top_logprobs);
    json again = prompt_logprobs(base, opt.baseline_model, prompt, opt.top_logprobs);
    json other = prompt_logprobs(cand, opt.candidate_model, prompt, opt.top_logprobs);
    accumulate(fresh, again, r.drift);
    accumulate(fresh, other, r.candidate);
  }
  r.pass = r.candidate.positions > 0 &&
           r.candidate.mean_kl <= r.drift.mean_kl + opt.kl_tolerance &&
           r.candidate.top1_agreement >= r.drift.top1_agreement - opt.agreement_tolerance;
  return r;
}

std::string CompareReport::table() const {
  std::ostringstream out;
  char line[200];
  std::snprintf(line, sizeof line, "%-28s %9s %14s %12s %12s\n", "vs baseline (fresh)", "positions", "top1_agreement",
                "mean_kl", "max_kl");
  out << line;
  for (const auto& [name, s] : {std::pair<const char*, const CompareStats*>{"baseline again (drift)", &drift},
                                {"candidate", &candidate}}) {
    std::snprintf(line, sizeof line, "%-28s %9d %13.2f%% %12.3e %12.3e\n", name, s->positions, 100.0 * s->top1_agreement,
                  s->mean_kl, s->max_kl);
    out << line;
  }
  out << (pass ? "PASS: candidate within the baseline's own drift\n" : "FAIL: candidate outside the baseline's drift\n");
  return out.str();
}

json CompareReport::to_json() const {
  auto s = [](const CompareStats& c) {
    return json{{"positions", c.positions}, {"top1_agreement", c.top1_agreement}, {"mean_kl", c.mean_kl}, {"max_kl", c.max_kl}};
  };
  return {{"candidate", s(candidate)}, {"drift", s(drift)}, {"pass", pass}};
}

}  // namespace servedeck::tools
