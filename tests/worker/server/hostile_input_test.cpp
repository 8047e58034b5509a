// Hostile requests to the worker's HTTP surface over real HTTP on port 0 (fake model): each case
// names the input that once broke a route. A bad field is the client's 400 naming the field, the
// value read and what was expected, never a 500, and the worker keeps serving.
#include <doctest/doctest.h>

#include "tests/worker/server/server_fixture.hpp"

using namespace servedeck;
using namespace servedeck::worker;
using namespace servedeck::worker::testing;
using nlohmann::json;

namespace {

std::string error_message(const http::ClientResponse& r) { return json::parse(r.body)["error"]["message"].get<std::string>(); }

}  // namespace

TEST_CASE("/tokenize: a non-boolean return_token_strs is a 400 naming the field, not a 500") {
  Fixture f;
  auto r = f.post("/tokenize", R"({"prompt":"hi","return_token_strs":"yes"})");
  CHECK(r.status == 400);
  CHECK(error_message(r) == "field 'return_token_strs': expected true or false, got \"yes\"");
  auto ok = f.post("/tokenize", R"({"prompt":"hi","return_token_strs":true})");
  CHECK(ok.status == 200);
  CHECK(json::parse(ok.body)["token_strs"].size() == 2);
}
