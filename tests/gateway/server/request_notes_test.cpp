// log_safe: the client's text as part of one log line; quoted_client_id: a client id in an error or the request log.
#include <doctest/doctest.h>

#include <string>

#include "gateway/server/request_notes.hpp"

using servedeck::gateway::log_safe;

TEST_CASE("log_safe: control characters are written as \\xNN, so a note stays one line") {
  CHECK(log_safe("dropped 'x\nFORGED line'") == "dropped 'x\\x0aFORGED line'");
  CHECK(log_safe(std::string("a\r\0b\x7f", 5)) == "a\\x0d\\x00b\\x7f");
  CHECK(log_safe("caf\xc3\xa9 \xe6\x97\xa5") == "caf\xc3\xa9 \xe6\x97\xa5");  // UTF-8 passes as it is
}

TEST_CASE("log_safe: a long text is cut at the byte bound, never inside a UTF-8 character") {
  CHECK(log_safe("abcdef", 6) == "abcdef");
  CHECK(log_safe("abcdefg", 6) == "abcdef\xe2\x80\xa6");
  // "ab" then a 3-byte character at bytes 2..4: a bound of 3 or 4 falls inside it.
  CHECK(log_safe("ab\xe6\x97\xa5z", 3) == "ab\xe2\x80\xa6");
  CHECK(log_safe("ab\xe6\x97\xa5z", 4) == "ab\xe2\x80\xa6");
  CHECK(log_safe("ab\xe6\x97\xa5z", 5) == "ab\xe6\x97\xa5\xe2\x80\xa6");
  CHECK(log_safe(std::string(100000, 'x')).size() == servedeck::gateway::k_max_note_bytes + 3);
}

TEST_CASE("quoted_client_id keeps an id up to the limit and cuts a longer one, naming its length") {
  using servedeck::gateway::k_max_quoted_id_bytes;
  using servedeck::gateway::quoted_client_id;
  CHECK(quoted_client_id("glm53-flash") == "glm53-flash");
  const std::string at_limit(k_max_quoted_id_bytes, 'a');
  CHECK(quoted_client_id(at_limit) == at_limit);
  const std::string long_id(10 * 1024 * 1024, 'm');
  CHECK(quoted_client_id(long_id) == std::string(k_max_quoted_id_bytes, 'm') + "\xE2\x80\xA6 (10485760 bytes)");
  // Never cut inside a UTF-8 character: "é" (2 bytes) across the 128-byte limit, then a 4-byte one.
  const std::string id = std::string(127, 'a') + "\xC3\xA9" + std::string(50, 'b');
  CHECK(quoted_client_id(id) == std::string(127, 'a') + "\xE2\x80\xA6 (179 bytes)");
  const std::string id4 = std::string(126, 'a') + "\xF0\x9F\x98\x80" + "z";
  CHECK(quoted_client_id(id4) == std::string(126, 'a') + "\xE2\x80\xA6 (131 bytes)");
}
