// gateway/server/stream_normalizer: estimate_request_tokens() against a real count — the request
// rendered with Qwen3's chat template and counted with Qwen3's tokenizer (node,
// qwen3_prompt_tokens.mjs, node_modules at the repository root). The estimate is what a
// synthesised usage reports as prompt_tokens (G12); this bounds how far off it is on the fixture
// requests, with tools and without.
#include <doctest/doctest.h>

#include <sys/wait.h>

#include <cmath>
#include <cstdio>
#include <string>

#include <nlohmann/json.hpp>

#include "gateway/server/stream_normalizer.hpp"
#include "tests/gateway/server/fixture_files.hpp"

using nlohmann::json;

namespace {

/// {"with_tools", "without_tools"} for fixture `name`, from the node reference.
json qwen3_counts(const std::string& name) {
  const std::string src = SERVEDECK_SOURCE_DIR;
  const std::string cmd = "SERVEDECK_SOURCE_DIR='" + src + "' node '" + src +
                          "/tests/gateway/server/qwen3_prompt_tokens.mjs' '" + src + "/tests/gateway/server/fixtures/" +
                          name + "' 2>&1";
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  REQUIRE(p);
  char buf[4096];
  for (std::size_t n; (n = fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
  const int status = pclose(p);
  REQUIRE_MESSAGE((WIFEXITED(status) && WEXITSTATUS(status) == 0), "node failed: " << out);
  return json::parse(out);
}

}  // namespace

TEST_CASE("G12 prompt estimate: within 15% of Qwen3's template + tokenizer on the fixture requests") {
  for (const std::string name : {"g12_request.json", "g12_request_code.json"}) {
    CAPTURE(name);
    const json ref = qwen3_counts(name);
    json body = json::parse(servedeck::test::read_gateway_fixture(name));
    const auto with_tools = servedeck::gateway::estimate_request_tokens(body);
    body.erase("tools");
    const auto without_tools = servedeck::gateway::estimate_request_tokens(body);
    MESSAGE(name << ": estimate " << with_tools << " vs Qwen3 " << ref["with_tools"] << " (with tools), "
                 << without_tools << " vs " << ref["without_tools"] << " (without)");
    const double real_with = ref["with_tools"].get<double>();
    const double real_without = ref["without_tools"].get<double>();
    REQUIRE(real_with > real_without);  // the reference did render the tools
    CHECK(std::fabs(static_cast<double>(with_tools) - real_with) <= 0.15 * real_with);
    CHECK(std::fabs(static_cast<double>(without_tools) - real_without) <= 0.15 * real_without);
  }
}
