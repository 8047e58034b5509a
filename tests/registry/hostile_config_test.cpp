// models.toml values chosen to break the registry: a KV cap whose product overflows, and
// placeholders that would make rendering quadratic.
#include <doctest/doctest.h>

#include <string>

#include "registry/registry.hpp"

using namespace servedeck::registry;

namespace {

std::string all_text(const std::vector<Diagnostic>& d) {
  std::string out;
  for (const auto& x : d) out += x.to_string() + "\n";
  return out;
}

}  // namespace

TEST_CASE("hostile config: ctx × kv_cache_bytes_per_token past 2^48 (or past int64) is an error naming both") {
  for (const char* ctx : {"17179869185", "1099511627776"}) {  // 2^34 + 1 (the product overflows 2^63), 2^40
    std::vector<Diagnostic> d;
    Registry reg = parse_registry(std::string("[models.m]\nengine = \"command\"\nprogram = \"/bin/true\"\nctx = ") + ctx +
                                      "\nkv_cache_bytes_per_token = 1073741824\n",
                                  "models.toml", d);
    INFO(all_text(d));
    CHECK(all_text(d).find(std::string("models.m: ctx = ") + ctx + " × kv_cache_bytes_per_token = 1073741824 is a KV cap of ") !=
          std::string::npos);
    CHECK(all_text(d).find("expected at most 2^48 (256 TiB)") != std::string::npos);
    REQUIRE(reg.models.size() == 1);
    CHECK(reg.models[0].kv_cache_bytes().value() > k_max_kv_cache_bytes);  // saturated, never wrapped
  }
  std::vector<Diagnostic> ok;
  Registry glm = parse_registry("[models.m]\nengine = \"command\"\nprogram = \"/bin/true\"\nctx = 327680\n"
                                "kv_cache_bytes_per_token = 17200\n",
                                "models.toml", ok);
  CHECK(ok.empty());
  CHECK(glm.models.at(0).kv_cache_bytes() == int64_t{5636096000});
}

TEST_CASE("hostile config: 4 MB of '{' without a '}' renders in linear time, unchanged") {
  const std::string braces(4u << 20, '{');
  Registry reg = parse_registry("[models.m]\nengine = \"command\"\nprogram = \"/bin/true\"\nctx = 16\nargs = [\"" + braces +
                                    "\", \"{{port}\", \"{port\", \"{" + std::string(100, 'X') + "}\"]\n",
                                "models.toml");
  LaunchSpec s = render_launch(reg.models.at(0), 9000, reg.server);
  REQUIRE(s.argv.size() == 5);
  CHECK(s.argv[1] == braces);
  CHECK(s.argv[2] == "{9000");
  CHECK(s.argv[3] == "{port");
  CHECK(s.argv[4] == "{" + std::string(100, 'X') + "}");
}
