#include <doctest/doctest.h>

#include <string>

#include "common/sse.hpp"

using servedeck::sse::Parser;

TEST_CASE("sse parser yields the same events whatever the chunk boundaries") {
  const std::string wire =
      "data: {\"a\":1}\r\n\r\n: keepalive\n\nevent: response.created\ndata: x\ndata: y\n\ndata: [DONE]\n\n";
  for (std::size_t split = 0; split <= wire.size(); ++split) {
    Parser p;
    auto ev = p.feed(wire.substr(0, split));
    auto rest = p.feed(wire.substr(split));
    ev.insert(ev.end(), rest.begin(), rest.end());
    REQUIRE(ev.size() == 4);
    CHECK(ev[0].data == "{\"a\":1}");
    CHECK(ev[1].comment);
    CHECK(ev[1].data == "keepalive");
    CHECK(ev[2].event == "response.created");
    CHECK(ev[2].data == "x\ny");
    CHECK(ev[3].data == "[DONE]");
    CHECK_FALSE(p.finish().has_value());
  }
}

TEST_CASE("sse parser returns an unterminated last event from finish()") {
  Parser p;
  CHECK(p.feed("data: {\"x\":2}\n").empty());
  auto last = p.finish();
  REQUIRE(last.has_value());
  CHECK(last->data == "{\"x\":2}");
}

TEST_CASE("sse parser bounds one event's size") {
  Parser p(16);
  auto ev = p.feed("data: 0123456789abcdefghij\n\ndata: ok\n\n");
  CHECK(p.overflow());
  REQUIRE(ev.size() == 1);
  CHECK(ev[0].data == "ok");
}

TEST_CASE("format_data splits payload lines") {
  CHECK(servedeck::sse::format_data("a\nb") == "data: a\ndata: b\n\n");
  CHECK(servedeck::sse::format_comment("hb") == ": hb\n\n");
}

TEST_CASE("sse parser in stop mode: the events before an oversized one, nothing after") {
  Parser p(16, Parser::OnOverflow::stop);
  auto ev = p.feed("data: a\n\ndata: 0123456789abcdefghij\n\ndata: ok\n\n");
  CHECK(p.overflow());
  REQUIRE(ev.size() == 1);
  CHECK(ev[0].data == "a");
  CHECK(p.feed("data: later\n\n").empty());
  CHECK_FALSE(p.finish().has_value());
}
