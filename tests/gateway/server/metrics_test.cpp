// The metrics' label sets stay bounded and every rendered line stays one valid line, whatever
// codes and paths arrive from engines and clients.
#include <doctest/doctest.h>

#include <sstream>
#include <string>

#include "gateway/server/metrics.hpp"

using namespace servedeck::gateway;

namespace {

int count_lines(const std::string& text, const std::string& prefix) {
  int n = 0;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) n += line.rfind(prefix, 0) == 0 ? 1 : 0;
  return n;
}

}  // namespace

TEST_CASE("engine error codes are a bounded label set: the first k_max_error_codes, then \"other\"") {
  // Regression: every distinct engine code became a new series, without bound.
  Metrics m;
  const int distinct = static_cast<int>(Metrics::k_max_error_codes) + 500;
  for (int i = 0; i < distinct; ++i) m.count_error("glm53", "engine_code_" + std::to_string(i));
  m.count_error("glm53", "engine_code_0");  // a code already labelled keeps its own series
  const std::string text = m.render(SlotSnapshot{});
  CHECK(count_lines(text, "servedeck_request_errors_total{") == static_cast<int>(Metrics::k_max_error_codes) + 1);
  CHECK(m.errors("glm53", "engine_code_0") == 2);
  CHECK(m.errors("glm53", "other") == distinct - static_cast<int>(Metrics::k_max_error_codes));
}

TEST_CASE("label values from outside are cut, one printable line, and escaped by the exposition rules") {
  Metrics m;
  m.count_error("glm53", std::string("a\"b\\c\nd\re\x01\xff\xc3\xa9") + std::string(200, 'x'));
  const std::string text = m.render(SlotSnapshot{});
  const std::string expected = "servedeck_request_errors_total{model=\"glm53\",code=\"a\\\"b\\\\c_d_e____" +
                               std::string(Metrics::k_max_label_bytes - 13, 'x') + "\"} 1\n";
  CAPTURE(text);
  CHECK(text.find(expected) != std::string::npos);
  for (unsigned char c : text) CHECK_MESSAGE((c == '\n' || (c >= 0x20 && c < 0x7f)), "byte ", int(c));
  CHECK(metric_label_value("ok_code", 64) == "ok_code");
  CHECK(metric_label_value("abcdef", 3) == "abc");
  CHECK(prometheus_escape("a\"b\\c\nd") == "a\\\"b\\\\c\\nd");
}
