// The gateway's metrics, rendered as Prometheus text exposition format 0.0.4
// (https://prometheus.io/docs/instrumenting/exposition_formats/) at GET /metrics.
//
//   servedeck_requests_total{model,status}           counter   requests answered, by base model and HTTP status
//   servedeck_request_errors_total{model,code}       counter   requests that ended with an error, by error code
//                                                              (the first k_max_error_codes distinct codes,
//                                                              later ones under code="other")
//   servedeck_ttft_seconds{model}                    histogram time to first token (first output event), seconds
//   servedeck_decode_tokens_per_second{model}        histogram completion tokens / (total − TTFT), tok/s
//   servedeck_in_flight_requests                     gauge     requests being proxied now
//   servedeck_queued_requests                        gauge     requests waiting for a model switch
//   servedeck_slot_state{model,state}                gauge     1 for the slot's current state
//   servedeck_policy_repairs_total{policy,model}     counter   repairs made by policies (RepairCounter)
//   servedeck_unserved_requests_total{path}          counter   requests to paths the gateway does not serve
//                                                              (first k_max_unserved_paths distinct paths,
//                                                              later ones under path="other")
//
// Thread-safety: every method may be called from any thread (one mutex; updates are a few
// map operations).
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "gateway/supervisor/slot_control.hpp"

namespace servedeck::gateway {

class Metrics {
 public:
  Metrics();

  void count_request(std::string_view model, int status);
  /// A request that ended with error `code` (servedeck's own, or whatever the engine sent). The
  /// label set is bounded: codes are cut at k_max_label_bytes with bytes outside printable ASCII
  /// written as '_' (metric_label_value), and past k_max_error_codes distinct codes every new one
  /// counts under "other".
  void count_error(std::string_view model, std::string_view code);
  int64_t errors(std::string_view model, std::string_view code) const;
  /// note: servedeck's own codes (gateway, bridges, policies) are about 60; 128 leaves room for
  /// an engine's few while an engine that invents a code per error cannot grow the exposition.
  static constexpr std::size_t k_max_error_codes = 128;
  static constexpr std::size_t k_max_label_bytes = 64;
  void observe_ttft(std::string_view model, double seconds);
  void observe_decode_rate(std::string_view model, double tokens_per_second);
  void add_in_flight(int delta);
  void add_queued(int delta);
  /// The repair counter policies call (policies::RepairCounter has this signature).
  void count_repair(std::string_view policy, std::string_view model);
  /// A request to a path no route serves (a client pointed at an API the gateway lacks). The
  /// label set is bounded: paths are cut at 128 bytes (metric_label_value), and past
  /// k_max_unserved_paths distinct paths every new one counts under "other".
  void count_unserved(std::string_view path);
  int64_t unserved(std::string_view path) const;
  static constexpr std::size_t k_max_unserved_paths = 32;

  int64_t requests(std::string_view model, int status) const;
  int64_t repairs(std::string_view policy, std::string_view model) const;
  int64_t in_flight() const;

  /// The whole exposition; `slot` gives the slot-state gauge.
  std::string render(const SlotSnapshot& slot) const;

 private:
  struct Histogram {
    std::vector<double> bounds;          // upper bounds, ascending
    std::vector<int64_t> counts;         // per bucket (not cumulative), bounds.size() + 1 (+Inf)
    double sum = 0;
    int64_t count = 0;
  };
  static void observe(Histogram& h, double v);
  static void render_histogram(std::string& out, std::string_view name, const std::map<std::string, Histogram, std::less<>>& hs);

  mutable std::mutex mu_;
  std::map<std::pair<std::string, int>, int64_t> requests_;
  std::map<std::pair<std::string, std::string>, int64_t> errors_;
  std::set<std::string> error_codes_;  // distinct code labels in errors_ ("other" aside)
  std::map<std::pair<std::string, std::string>, int64_t> repairs_;
  std::map<std::string, int64_t, std::less<>> unserved_;
  std::map<std::string, Histogram, std::less<>> ttft_;
  std::map<std::string, Histogram, std::less<>> decode_;
  std::vector<double> ttft_bounds_;
  std::vector<double> decode_bounds_;
  int64_t in_flight_ = 0;
  int64_t queued_ = 0;
};

/// Escapes a Prometheus label value: backslash, double quote and line feed, the three the text
/// format requires escaped (exposition format 0.0.4, "label_value").
std::string prometheus_escape(std::string_view v);

/// A label value from outside text (an engine's error code, a request path): its first
/// `max_bytes` bytes, each byte outside printable ASCII (controls, DEL, bytes of multi-byte or
/// invalid UTF-8) written as '_', so the value is valid UTF-8 and one line; prometheus_escape
/// still escapes it when rendered.
std::string metric_label_value(std::string_view v, std::size_t max_bytes);

}  // namespace servedeck::gateway
