// check_toml_nesting, and parse_registry refusing what it refuses before toml++ recurses.
#include <doctest/doctest.h>

#include <string>

#include "registry/registry.hpp"
#include "registry/toml_nesting.hpp"

using namespace servedeck::registry;

namespace {

std::string dotted(int segments) {
  std::string s = "a";
  for (int i = 1; i < segments; ++i) s += ".a";
  return s;
}

std::string all_text(const std::vector<Diagnostic>& d) {
  std::string out;
  for (const auto& x : d) out += x.to_string() + "\n";
  return out;
}

}  // namespace

TEST_CASE("toml nesting: headers, dotted keys and brackets within the bounds pass") {
  const std::string text = "# a comment with [[ { . . .\n[" + dotted(4) + "]\nx." + dotted(3) +
                           " = 1.5\n[[" + dotted(4) + "]]\n" + "t = { " + dotted(4) +
                           " = [[1, 2], [3]], b = {}, c = {d = 1,} }\n"
                           "s = \"a.b.c.d.e.f [ { \\\" .\"\nl = 'x.y.z'\nm = \"\"\"\n[" +
                           dotted(40) + "]\n\"\"\"\n\"q.u.o.t.e.d\" = 2\n";
  CHECK_FALSE(check_toml_nesting(text, 4, 3).has_value());
}

TEST_CASE("toml nesting: a header, a dotted key or brackets past the bound are refused with the line") {
  auto header = check_toml_nesting("x = 1\n\n[" + dotted(5) + "]\n", 4, 8);
  REQUIRE(header);
  CHECK(header->line == 3);
  CHECK(header->message == "a table header with 5 nesting levels at line 3; expected at most 4");
  auto key = check_toml_nesting("[t]\n" + dotted(5) + " = 1\n", 4, 8);
  REQUIRE(key);
  CHECK(key->line == 2);
  CHECK(key->message.rfind("a dotted key with 5", 0) == 0);
  auto inline_key = check_toml_nesting("t = { b = 1, " + dotted(5) + " = 2 }\n", 4, 8);
  REQUIRE(inline_key);
  CHECK(inline_key->message.rfind("a dotted key", 0) == 0);
  auto arrays = check_toml_nesting("a = [[[[1]]]]\n", 4, 3);
  REQUIRE(arrays);
  CHECK(arrays->message == "an array or inline table with 4 nesting levels at line 1; expected at most 3");
  auto multi_line = check_toml_nesting("a = [\n[\n[\n[1]]]]\n", 4, 3);
  REQUIRE(multi_line);
  CHECK(multi_line->line == 4);
}

TEST_CASE("registry: a 40,000-deep header or dotted key is a diagnostic, not a stack overflow") {
  for (const std::string& text : {"[zzz." + dotted(40000) + "]\n", "[models.m.policies]\nextra." + dotted(40000) + " = 1\n",
                                  "[[rules]]\nid = \"r\"\n[rules.match." + dotted(20000) + "]\n",
                                  "x = " + std::string(40000, '[') + std::string(40000, ']') + "\n"}) {
    std::vector<Diagnostic> d;
    parse_registry(text, "models.toml", d);
    REQUIRE(d.size() == 1);
    CHECK(all_text(d).find("TOML nesting: ") != std::string::npos);
    CHECK(all_text(d).find("expected at most 16") != std::string::npos);
  }
}
