// What a client hears about the slot's transient states: a model being drained by a switch
// (503 model_draining with Retry-After and the switch's target, not a 409 "not running"), an
// unhealthy one (503 model_unhealthy with the reason), and a request that got no first byte
// being reported to the slot (so liveness marks it unhealthy).
#include <doctest/doctest.h>

#include "tests/gateway/server/gateway_rig.hpp"

using namespace servedeck;
using namespace servedeck::test::gateway_rig;

TEST_CASE("a request for a model a switch is draining gets 503 model_draining naming the switch's target") {
  Rig rig;
  rig.slots.set_draining(true, "qwen");
  auto r = rig.post("/v1/chat/completions", chat("glm53-flash"));
  CHECK(r.status == 503);
  CHECK(r.headers["retry-after"] == "7");
  auto e = json::parse(r.body)["error"];
  CHECK(e["code"] == "model_draining");
  auto m = e["message"].get<std::string>();
  INFO(m);
  CHECK(m.find("model 'glm53' is draining: the slot is switching to 'qwen'") != std::string::npos);
  CHECK(m.find("not running") == std::string::npos);
  // Another model that is not running keeps its ordinary answer.
  CHECK(rig.post("/v1/chat/completions", chat("qwen3.8-flash-next")).status == 409);
  rig.slots.set_state(gateway::SlotState::stopping, "glm53");
  CHECK(json::parse(rig.post("/v1/chat/completions", chat("glm53-flash")).body)["error"]["code"] == "model_draining");
  CHECK(rig.engine.requests() == 0);
}

TEST_CASE("a request for an unhealthy model gets 503 model_unhealthy with the reason") {
  Rig rig;
  rig.slots.set_state(gateway::SlotState::unhealthy, "glm53");
  rig.slots.set_last_error("liveness: a one-token completion got no answer within 30000 ms (timeout)\nmore");
  auto r = rig.post("/v1/chat/completions", chat("glm53-flash"));
  CHECK(r.status == 503);
  CHECK(r.headers["retry-after"] == "7");
  auto e = json::parse(r.body)["error"];
  CHECK(e["code"] == "model_unhealthy");
  CHECK(e["message"] ==
        "model 'glm53' is unhealthy: liveness: a one-token completion got no answer within 30000 ms (timeout)");
  CHECK(rig.engine.requests() == 0);
  const std::string metrics = rig.get("/metrics").body;
  CHECK(metrics.find("servedeck_slot_state{model=\"glm53\",state=\"unhealthy\"} 1") != std::string::npos);
}

TEST_CASE("a request that gets no first byte in time is reported to the slot") {
  Rig rig("glm53", 5000, [](registry::Registry& r) { r.models[0].first_byte_timeout_ms = 400; });
  Script s = test::sse_script({role_ev(), content_ev("late"), finish_ev(), "[DONE]"});
  s.pieces.front().delay_ms = 1500;
  rig.engine.push(s);
  auto r = rig.post("/v1/chat/completions", chat());
  CHECK(r.status == 504);
  CHECK(json::parse(r.body)["error"]["code"] == "upstream_first_byte_timeout");
  REQUIRE(wait_for([&] { return rig.slots.unresponsive().size() == 1; }));
  auto report = rig.slots.unresponsive()[0];
  INFO(report);
  CHECK(report.rfind("glm53 " + std::to_string(rig.engine.port()) + ": ", 0) == 0);
}
