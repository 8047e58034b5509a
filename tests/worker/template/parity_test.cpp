// Parity with @huggingface/jinja (transformers.js's Jinja): Qwen3, DeepSeek-V3 and our
// GLM-style fixture over the conversations in conversations/. Needs `node` and the npm
// packages at the repository root; without them the test fails, it does not skip.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>

#include "tests/worker/template/parity_harness.hpp"

namespace fs = std::filesystem;

namespace {

std::string node_script() { return source_dir() + "/tests/worker/template/reference_render.mjs"; }

void require_node() {
  int status = 0;
  const std::string version = run_command("node --version 2>&1", status);
  REQUIRE_MESSAGE(status == 0, "`node` is not runnable (" << version
                                   << "); the chat-template parity test needs Node.js and `npm ci`");
  REQUIRE_MESSAGE(fs::exists(source_dir() + "/node_modules/@huggingface/jinja/package.json"),
                  "node_modules/@huggingface/jinja is missing under " << source_dir() << ": run `npm ci`");
}

}  // namespace

TEST_CASE("reference_render.mjs prints the rendered string in single mode") {
  require_node();
  char dir[] = "/tmp/servedeck_template_single_XXXXXX";
  REQUIRE(mkdtemp(dir) != nullptr);
  const std::string t = std::string(dir) + "/t.jinja";
  const std::string c = std::string(dir) + "/c.json";
  std::ofstream(t) << "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}";
  std::ofstream(c) << R"({"messages": [{"role": "user", "content": "héllo"}]})";
  int status = 0;
  const std::string out = run_command("node '" + node_script() + "' '" + t + "' '" + c + "'", status);
  CHECK(status == 0);
  CHECK(out == "[user] héllo\n");
  fs::remove_all(dir);
}

TEST_CASE("Qwen3, DeepSeek-V3 and GLM-style templates render like @huggingface/jinja") {
  require_node();
  run_parity("@huggingface/jinja", "node '" + node_script() + "' --batch");
}
