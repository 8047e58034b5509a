#include <doctest/doctest.h>

#include <string>

#include "common/json_limits.hpp"

TEST_CASE("nesting beyond the limit is reported with its byte offset; strings do not count") {
  std::string deep = std::string(100000, '[') + std::string(100000, ']');
  auto err = servedeck::check_json_nesting(deep);
  REQUIRE(err.has_value());
  CHECK(*err == "JSON nested deeper than 256 levels (at byte 256)");
  CHECK_FALSE(servedeck::check_json_nesting(R"({"a":"[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["})", 3).has_value());
  CHECK_FALSE(servedeck::check_json_nesting(R"({"a":[{"b":[1]}],"c":"\"{"})", 4).has_value());
  CHECK(servedeck::check_json_nesting(R"({"a":[{"b":[1]}]})", 3).has_value());
}

TEST_CASE("dump_safe replaces invalid UTF-8 instead of throwing") {
  nlohmann::json j = {{"message", std::string("last read: '\xff'")}};
  CHECK_THROWS(j.dump());
  CHECK(servedeck::dump_safe(j) == "{\"message\":\"last read: '\xef\xbf\xbd'\"}");
}

TEST_CASE("parse_untrusted refuses deep, oversized and malformed text without throwing") {
  servedeck::JsonError err;
  auto deep = servedeck::parse_untrusted(std::string(100000, '[') + std::string(100000, ']'), &err);
  CHECK(deep.is_discarded());
  CHECK(err.message == "JSON nested deeper than 256 levels (at byte 256)");

  auto big = servedeck::parse_untrusted(R"({"a":"0123456789"})", &err, {.max_depth = 8, .max_bytes = 10});
  CHECK(big.is_discarded());
  CHECK(err.message == "JSON text of 18 bytes exceeds the limit of 10 bytes");

  auto bad = servedeck::parse_untrusted(R"({"a":1,})", &err);
  CHECK(bad.is_discarded());
  CHECK(err.byte == 7);
  CHECK(err.message.rfind("malformed JSON at byte 7: ", 0) == 0);

  CHECK(servedeck::parse_untrusted("").is_discarded());  // no error sink: still no throw
  auto ok = servedeck::parse_untrusted(R"({"a":[1,{"b":"c"}]})", &err);
  REQUIRE(ok.is_object());
  CHECK(ok["a"][1]["b"] == "c");
}
