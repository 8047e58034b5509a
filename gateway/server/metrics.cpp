#include "gateway/server/metrics.hpp"

#include <cstdio>

namespace servedeck::gateway {

namespace {

std::string num(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

}  // namespace

std::string prometheus_escape(std::string_view v) {
  std::string out;
  out.reserve(v.size());
  for (char c : v) {
    if (c == '\\') out += "\\\\";
    else if (c == '"') out += "\\\"";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

// note: TTFT buckets span a cached short prompt (~50 ms) to a 300k-token prefill (~205 s on
// GLM, docs seed); decode buckets span an offloaded MoE (~11-17 tok/s) to a resident one (~173).
Metrics::Metrics()
    : ttft_bounds_{0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600},
      decode_bounds_{1, 5, 10, 15, 20, 30, 50, 75, 100, 150, 200, 300, 500} {}

void Metrics::count_request(std::string_view model, int status) {
  std::lock_guard lk(mu_);
  ++requests_[{std::string(model), status}];
}

std::string metric_label_value(std::string_view v, std::size_t max_bytes) {
  std::string out(v.substr(0, max_bytes));
  for (char& c : out)
    if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) > 0x7e) c = '_';
  return out;
}

void Metrics::count_error(std::string_view model, std::string_view code) {
  std::string label = metric_label_value(code, k_max_label_bytes);
  std::lock_guard lk(mu_);
  if (!error_codes_.count(label)) {
    if (error_codes_.size() >= k_max_error_codes) label = "other";
    else error_codes_.insert(label);
  }
  ++errors_[{std::string(model), std::move(label)}];
}

void Metrics::observe(Histogram& h, double v) {
  std::size_t i = 0;
  while (i < h.bounds.size() && v > h.bounds[i]) ++i;
  ++h.counts[i];
  h.sum += v;
  ++h.count;
}

void Metrics::observe_ttft(std::string_view model, double seconds) {
  std::lock_guard lk(mu_);
  auto it = ttft_.find(model);
  if (it == ttft_.end())
    it = ttft_.emplace(std::string(model), Histogram{ttft_bounds_, std::vector<int64_t>(ttft_bounds_.size() + 1), 0, 0}).first;
  observe(it->second, seconds);
}

void Metrics::observe_decode_rate(std::string_view model, double tokens_per_second) {
  std::lock_guard lk(mu_);
  auto it = decode_.find(model);
  if (it == decode_.end())
    it = decode_.emplace(std::string(model), Histogram{decode_bounds_, std::vector<int64_t>(decode_bounds_.size() + 1), 0, 0})
             .first;
  observe(it->second, tokens_per_second);
}

void Metrics::add_in_flight(int delta) {
  std::lock_guard lk(mu_);
  in_flight_ += delta;
}

void Metrics::add_queued(int delta) {
  std::lock_guard lk(mu_);
  queued_ += delta;
}

void Metrics::count_repair(std::string_view policy, std::string_view model) {
  std::lock_guard lk(mu_);
  ++repairs_[{std::string(policy), std::string(model)}];
}

void Metrics::count_unserved(std::string_view path) {
  std::string key = metric_label_value(path, 128);
  std::lock_guard lk(mu_);
  auto it = unserved_.find(key);
  if (it == unserved_.end() && unserved_.size() >= k_max_unserved_paths) it = unserved_.try_emplace("other", 0).first;
  if (it == unserved_.end()) it = unserved_.emplace(std::move(key), 0).first;
  ++it->second;
}

int64_t Metrics::unserved(std::string_view path) const {
  std::lock_guard lk(mu_);
  auto it = unserved_.find(path);
  return it == unserved_.end() ? 0 : it->second;
}

int64_t Metrics::requests(std::string_view model, int status) const {
  std::lock_guard lk(mu_);
  auto it = requests_.find({std::string(model), status});
  return it == requests_.end() ? 0 : it->second;
}

int64_t Metrics::errors(std::string_view model, std::string_view code) const {
  std::lock_guard lk(mu_);
  auto it = errors_.find({std::string(model), std::string(code)});
  return it == errors_.end() ? 0 : it->second;
}

int64_t Metrics::repairs(std::string_view policy, std::string_view model) const {
  std::lock_guard lk(mu_);
  auto it = repairs_.find({std::string(policy), std::string(model)});
  return it == repairs_.end() ? 0 : it->second;
}

int64_t Metrics::in_flight() const {
  std::lock_guard lk(mu_);
  return in_flight_;
}

void Metrics::render_histogram(std::string& out, std::string_view name,
                               const std::map<std::string, Histogram, std::less<>>& hs) {
  for (const auto& [model, h] : hs) {
    std::string label = "model=\"" + prometheus_escape(model) + "\"";
    int64_t cumulative = 0;
    for (std::size_t i = 0; i < h.bounds.size(); ++i) {
      cumulative += h.counts[i];
      out += std::string(name) + "_bucket{" + label + ",le=\"" + num(h.bounds[i]) + "\"} " + std::to_string(cumulative) + "\n";
    }
    out += std::string(name) + "_bucket{" + label + ",le=\"+Inf\"} " + std::to_string(h.count) + "\n";
    out += std::string(name) + "_sum{" + label + "} " + num(h.sum) + "\n";
    out += std::string(name) + "_count{" + label + "} " + std::to_string(h.count) + "\n";
  }
}

std::string Metrics::render(const SlotSnapshot& slot) const {
  std::lock_guard lk(mu_);
  std::string out;
  out += "# HELP servedeck_requests_total Requests answered, by base model and HTTP status.\n";
  out += "# TYPE servedeck_requests_total counter\n";
  for (const auto& [k, v] : requests_)
    out += "servedeck_requests_total{model=\"" + prometheus_escape(k.first) + "\",status=\"" + std::to_string(k.second) +
           "\"} " + std::to_string(v) + "\n";
  out += "# HELP servedeck_request_errors_total Requests that ended with an error, by error code.\n";
  out += "# TYPE servedeck_request_errors_total counter\n";
  for (const auto& [k, v] : errors_)
    out += "servedeck_request_errors_total{model=\"" + prometheus_escape(k.first) + "\",code=\"" +
           prometheus_escape(k.second) + "\"} " + std::to_string(v) + "\n";
  out += "# HELP servedeck_ttft_seconds Time to first token, seconds.\n";
  out += "# TYPE servedeck_ttft_seconds histogram\n";
  render_histogram(out, "servedeck_ttft_seconds", ttft_);
  out += "# HELP servedeck_decode_tokens_per_second Completion tokens per second after the first token.\n";
  out += "# TYPE servedeck_decode_tokens_per_second histogram\n";
  render_histogram(out, "servedeck_decode_tokens_per_second", decode_);
  out += "# HELP servedeck_in_flight_requests Requests being proxied now.\n";
  out += "# TYPE servedeck_in_flight_requests gauge\n";
  out += "servedeck_in_flight_requests " + std::to_string(in_flight_) + "\n";
  out += "# HELP servedeck_queued_requests Requests waiting for a model switch.\n";
  out += "# TYPE servedeck_queued_requests gauge\n";
  out += "servedeck_queued_requests " + std::to_string(queued_) + "\n";
  out += "# HELP servedeck_slot_state 1 for the main slot's current state.\n";
  out += "# TYPE servedeck_slot_state gauge\n";
  for (auto s : {SlotState::stopped, SlotState::preflight, SlotState::starting, SlotState::ready, SlotState::unhealthy, SlotState::stopping,
                 SlotState::failed})
    out += "servedeck_slot_state{model=\"" + prometheus_escape(slot.model) + "\",state=\"" + std::string(to_string(s)) +
           "\"} " + (slot.state == s ? "1" : "0") + "\n";
  out += "# HELP servedeck_policy_repairs_total Repairs made by per-model policies.\n";
  out += "# TYPE servedeck_policy_repairs_total counter\n";
  for (const auto& [k, v] : repairs_)
    out += "servedeck_policy_repairs_total{policy=\"" + prometheus_escape(k.first) + "\",model=\"" +
           prometheus_escape(k.second) + "\"} " + std::to_string(v) + "\n";
  out += "# HELP servedeck_unserved_requests_total Requests to paths the gateway does not serve.\n";
  out += "# TYPE servedeck_unserved_requests_total counter\n";
  for (const auto& [path, v] : unserved_)
    out += "servedeck_unserved_requests_total{path=\"" + prometheus_escape(path) + "\"} " + std::to_string(v) + "\n";
  return out;
}

}  // namespace servedeck::gateway
