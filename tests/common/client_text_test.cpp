// quoted_client_id (common/client_text.hpp): short ids unchanged, long ones cut between UTF-8
// characters with their length named.
#include <doctest/doctest.h>

#include "common/client_text.hpp"

using servedeck::k_max_quoted_id_bytes;
using servedeck::quoted_client_id;

TEST_CASE("quoted_client_id keeps an id up to the limit and cuts a longer one, naming its length") {
  CHECK(quoted_client_id("glm53-flash") == "glm53-flash");
  const std::string at_limit(k_max_quoted_id_bytes, 'a');
  CHECK(quoted_client_id(at_limit) == at_limit);
  const std::string long_id(10 * 1024 * 1024, 'm');
  const std::string q = quoted_client_id(long_id);
  CHECK(q == std::string(k_max_quoted_id_bytes, 'm') + "\xE2\x80\xA6 (10485760 bytes)");
}

TEST_CASE("quoted_client_id never cuts inside a UTF-8 character") {
  // 127 ASCII bytes, then "é" (2 bytes) across the 128-byte limit, then more.
  const std::string id = std::string(127, 'a') + "\xC3\xA9" + std::string(50, 'b');
  const std::string q = quoted_client_id(id);
  CHECK(q.rfind(std::string(127, 'a') + "\xE2\x80\xA6 (179 bytes)", 0) == 0);
  // A 4-byte character straddling the limit is left out whole.
  const std::string id4 = std::string(126, 'a') + "\xF0\x9F\x98\x80" + "z";
  CHECK(quoted_client_id(id4) == std::string(126, 'a') + "\xE2\x80\xA6 (131 bytes)");
}
