// A switch that preflight refuses: declaration checks refuse before the running engine is
// stopped (it keeps serving); machine checks still refuse after the stop. What `status` shows for
// a slot that failed or never launched, and which log hears about a stop.
#include <doctest/doctest.h>

#include <fstream>
#include <sstream>

#include "common/http/client.hpp"
#include "gateway/supervisor/supervisor.hpp"
#include "supervisor_fixture.hpp"

using namespace servedeck;
using gateway::SlotState;
using sdtest::Fixture;
using sdtest::Lines;

namespace {

using sdtest::health_status;

std::string read_file(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

int count(const std::string& s, const std::string& part) {
  int n = 0;
  for (auto p = s.find(part); p != std::string::npos; p = s.find(part, p + 1)) ++n;
  return n;
}

}  // namespace

TEST_CASE("switch refusal: a missing program refuses before the stop; the running model stays ready and serving") {
  Fixture f;
  f.real_preflight = true;
  f.reg.server.restore_previous_on_failed_start = true;  // must not bounce the model that never stopped
  f.add("a");
  auto& ghost = f.add("ghost");
  ghost.program = f.state_dir + "/no-such-engine";
  auto& sup = f.make();
  REQUIRE(sup.switch_to("a").ok);
  auto before = sup.snapshot();
  REQUIRE(before.state == SlotState::ready);
  std::string log_a = sup.log_path();
  REQUIRE_FALSE(log_a.empty());

  Lines lines;
  auto r = sup.switch_to("ghost", lines.sink());
  INFO(lines.all());
  CHECK_FALSE(r.ok);
  CHECK(r.refused_before_stop);
  CHECK(r.error.find("preflight refused ghost before stopping a") != std::string::npos);
  CHECK(r.error.find("program " + ghost.program + " is missing or not executable") != std::string::npos);
  CHECK(lines.any("preflight: program"));
  CHECK_FALSE(lines.any("stopping a (pid"));
  CHECK_FALSE(lines.any("restoring the previous model"));

  // The slot is exactly as it was: same engine, ready, answering, leases granted.
  auto after = sup.snapshot();
  CHECK(after.state == SlotState::ready);
  CHECK(after.model == "a");
  CHECK(after.pid == before.pid);
  CHECK(after.port == before.port);
  CHECK(after.launch_id == before.launch_id);
  CHECK(after.switching_to.empty());
  CHECK(sdtest::alive(before.pid));
  CHECK(health_status(before.port) == 200);
  CHECK(sup.acquire("a") != nullptr);
  // The refusal is recorded (last error, a preflight event) and nothing was launched.
  CHECK(after.last_error.find("preflight refused ghost") != std::string::npos);
  CHECK(f.store->recent_launches(10).size() == 1);
  bool event = false;
  for (const auto& e : f.store->recent_events(20))
    if (e["kind"] == "preflight" && e["model"] == "ghost") {
      event = true;
      CHECK(e["detail"]["before_stop"] == true);
      CHECK(e["detail"]["kept_running"] == "a");
      CHECK(e["detail"]["refused"] == true);
    }
  CHECK(event);
  auto rec = f.store->launch(before.launch_id);
  REQUIRE(rec);
  CHECK(rec->state == "ready");
  auto st = sup.status_json();
  CHECK(st["state"] == "ready");
  CHECK(st["pid"] == before.pid);
  CHECK(st["log_path"] == log_a);
  CHECK(read_file(log_a).find("stopping") == std::string::npos);

  // A request-triggered switch takes the same path.
  auto r2 = sup.switch_for_request("ghost");
  CHECK_FALSE(r2.ok);
  CHECK(r2.refused_before_stop);
  CHECK(sup.snapshot().state == SlotState::ready);
  CHECK(sup.snapshot().pid == before.pid);
}

TEST_CASE("switch refusal: a machine check still refuses after the stop; status shows no stale launch and old logs stay closed") {
  Fixture f;
  f.add("a");
  f.add("big");
  auto& sup = f.make();
  REQUIRE(sup.switch_to("a").ok);
  auto a = sup.snapshot();
  std::string log_a = sup.log_path();
  REQUIRE_FALSE(log_a.empty());

  // The fixture's preflight refuses host_ram, a machine check: it is only judged after the stop.
  f.refuse_preflight = true;
  Lines lines;
  auto r = sup.switch_to("big", lines.sink());
  INFO(lines.all());
  CHECK_FALSE(r.ok);
  CHECK_FALSE(r.refused_before_stop);
  CHECK(lines.any("stopping a (pid"));
  CHECK(r.error.find("preflight refused big") != std::string::npos);
  CHECK_FALSE(sdtest::alive(a.pid));
  auto s = sup.snapshot();
  CHECK(s.state == SlotState::failed);
  CHECK(s.model == "big");

  // big never launched: no pid, port, log, uptime or memory of a's launch is shown for it.
  auto st = sup.status_json();
  INFO(st.dump());
  CHECK(st["state"] == "failed");
  CHECK(st["model"] == "big");
  CHECK(st["pid"] == 0);
  CHECK(st["port"] == 0);
  CHECK(st["last_pid"] == 0);
  CHECK(st["launch_id"] == 0);
  CHECK(st["log_path"] == "");
  CHECK(st["uptime_s"].is_null());
  CHECK(st["host_rss_gib"].is_null());
  CHECK(st["last_error"].get<std::string>().find("preflight refused big") != std::string::npos);
  CHECK(sup.log_path("big").empty());
  CHECK(sup.log_path().empty());  // `servedeck logs` does not show a's log as big's
  CHECK(sup.log_path("a") == log_a);

  // Later switches do not write into a's log (its engine exited long ago).
  std::string a_log_before = read_file(log_a);
  CHECK(count(a_log_before, "stopping: switch to big") == 1);
  f.refuse_preflight = false;
  REQUIRE(sup.switch_to("big").ok);
  REQUIRE(sup.switch_to("a").ok);
  CHECK(read_file(log_a) == a_log_before);
  CHECK(sup.log_path() != log_a);
}

TEST_CASE("switch refusal: status of a slot whose engine died shows the last pid and exit status, no live readings") {
  Fixture f;
  f.add("flaky", {"--exit-after-ready-ms", "500"});
  f.add("good");
  auto& sup = f.make();
  REQUIRE(sup.switch_to("flaky").ok);
  auto ready = sup.snapshot();
  std::string log_flaky = sup.log_path();
  REQUIRE(sdtest::wait_for([&] { return sup.snapshot().state == SlotState::failed; }, 5000));
  auto st = sup.status_json();
  INFO(st.dump());
  CHECK(st["state"] == "failed");
  CHECK(st["pid"] == 0);
  CHECK(st["port"] == 0);
  CHECK(st["last_pid"] == ready.pid);
  CHECK(st["last_port"] == ready.port);
  CHECK(st["exit_status"] == 3);
  CHECK(st["uptime_s"].is_null());
  CHECK(st["host_rss_gib"].is_null());
  CHECK(st["vram_gib"].is_null());
  CHECK(st["log_path"] == log_flaky);  // its own launch's log: the right one to read
  // The switch away from the failed slot does not append to the dead engine's log.
  std::string before = read_file(log_flaky);
  REQUIRE(sup.switch_to("good").ok);
  CHECK(read_file(log_flaky) == before);
}

TEST_CASE("switch refusal: the refused model and the refused checks are in the snapshot until a model comes up ready") {
  Fixture f;
  f.real_preflight = true;
  f.add("a");
  f.add("b");
  f.add("ghost").program = f.state_dir + "/no-such-engine";
  const std::string missing = "program " + f.state_dir + "/no-such-engine is missing or not executable";
  auto& sup = f.make();
  REQUIRE(sup.switch_to("a").ok);
  CHECK(sup.snapshot().refused_model.empty());
  CHECK(sup.snapshot().refusal.empty());
  CHECK(sup.status_json().contains("refused_model"));
  CHECK(sup.status_json()["refused_model"].is_null());
  CHECK(sup.status_json()["refusal"].is_null());

  Lines lines;
  REQUIRE(sup.switch_to("ghost", lines.sink()).refused_before_stop);
  auto s = sup.snapshot();
  INFO(s.refusal);
  CHECK(s.state == SlotState::ready);
  CHECK(s.model == "a");
  CHECK(s.refused_model == "ghost");
  // One line per refused check, "check: message", the message being what `switch` printed.
  CHECK(s.refusal.find("program: ") == 0);
  CHECK(s.refusal.find(missing) != std::string::npos);
  CHECK(lines.any(missing));
  // status_json carries both (for `servedeck status` and `status --json`).
  auto st = sup.status_json();
  INFO(st.dump());
  CHECK(st["refused_model"] == "ghost");
  CHECK(st["refusal"] == s.refusal);

  // A later successful switch (to another model) clears it.
  REQUIRE(sup.switch_to("b").ok);
  CHECK(sup.snapshot().refused_model.empty());
  CHECK(sup.snapshot().refusal.empty());
  CHECK(sup.status_json()["refused_model"].is_null());
  CHECK(sup.status_json()["refusal"].is_null());

  // Refused again, then the declaration fixed: the switch to it passes and clears it.
  REQUIRE(sup.switch_to("ghost").refused_before_stop);
  CHECK(sup.snapshot().refused_model == "ghost");
  f.reg.models.back().program = sdtest::fake_engine();
  REQUIRE(sup.switch_to("ghost").ok);
  CHECK(sup.snapshot().model == "ghost");
  CHECK(sup.snapshot().refused_model.empty());
  CHECK(sup.snapshot().refusal.empty());
}
