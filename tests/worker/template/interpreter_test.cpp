#include <doctest/doctest.h>
#include "worker/template/chat_template.hpp"
using servedeck::worker::ChatTemplate;
TEST_CASE("smoke") { CHECK(ChatTemplate::parse("a{{ 1 + 2 }}").render(nlohmann::ordered_json::object()) == "a3"); }
