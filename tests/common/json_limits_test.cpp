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
