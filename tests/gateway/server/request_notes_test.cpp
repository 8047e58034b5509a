// log_safe: the client's text as part of one log line.
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
