// Parity with Python jinja2 configured as transformers' apply_chat_template configures it
// (reference_render_jinja2.py). Exits 77 (ctest: skipped) when python3 or jinja2 is absent.
#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>

#include "tests/worker/template/parity_harness.hpp"

TEST_CASE("Qwen3, DeepSeek-V3 and GLM-style templates render like jinja2 in transformers' configuration") {
  int status = 0;
  run_command("python3 -c 'import jinja2' 2>/dev/null", status);
  if (status != 0) {
    std::fprintf(stderr, "SKIPPED: python3 with jinja2 (Debian python3-jinja2) is not available\n");
    std::exit(77);
  }
  run_parity("jinja2", "python3 '" + source_dir() + "/tests/worker/template/reference_render_jinja2.py' --batch",
             /*random_cases=*/150);
}
