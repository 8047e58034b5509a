#include <doctest/doctest.h>

#include <set>
#include <string>

#include "common/random_id.hpp"

TEST_CASE("random_id: prefix, underscore, 24 lower-case hex digits, distinct across calls") {
  std::set<std::string> seen;
  for (int i = 0; i < 1000; ++i) {
    const std::string id = servedeck::random_id("toolu");
    REQUIRE(id.size() == 6 + 24);
    CHECK(id.rfind("toolu_", 0) == 0);
    CHECK(id.find_first_not_of("0123456789abcdef", 6) == std::string::npos);
    seen.insert(id);
  }
  CHECK(seen.size() == 1000);
  CHECK(servedeck::random_id("").size() == 25);
}
