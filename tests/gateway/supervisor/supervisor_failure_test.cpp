// Failures stay inside their operation: a state-store error during a switch (injected with a
// SQLite trigger through a second connection, as a full disk or a corrupt page would raise it),
// and an engine body whose quoted excerpt would end inside a UTF-8 character. The switch fails
// with the reason, nothing is left running, the supervisor's threads live on and the next
// switch works.
#include <doctest/doctest.h>
#include <sqlite3.h>

#include <future>

#include "gateway/supervisor/engine_identity.hpp"
#include "gateway/supervisor/supervisor.hpp"
#include "supervisor_fixture.hpp"

using namespace servedeck;
using gateway::SlotState;
using sdtest::Fixture;
using sdtest::Lines;

namespace {

/// Runs `sql` on the fixture's database through a connection of its own.
void exec_sql(const Fixture& f, const std::string& sql) {
  sqlite3* db = nullptr;
  REQUIRE(sqlite3_open((f.state_dir + "/state.db").c_str(), &db) == SQLITE_OK);
  sqlite3_busy_timeout(db, 5000);
  char* err = nullptr;
  int rc = sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &err);
  std::string msg = err ? err : "";
  sqlite3_free(err);
  sqlite3_close(db);
  REQUIRE_MESSAGE(rc == SQLITE_OK, msg);
}

bool valid_utf8_json(const std::string& s) {
  try {
    (void)nlohmann::json(s).dump();  // throws type_error 316 on invalid UTF-8
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

}  // namespace

TEST_CASE("failure: a store error while a request-triggered switch records its launch fails that switch only") {
  Fixture f;
  f.add("a");
  auto& sup = f.make();
  exec_sql(f,
           "CREATE TRIGGER sd_fail BEFORE INSERT ON launches "
           "BEGIN SELECT RAISE(ABORT, 'disk I/O error (injected)'); END;");
  // On the switch thread (ensure_running): an exception there used to reach std::terminate.
  std::promise<std::pair<bool, std::string>> got;
  sup.ensure_running("a", [&got](gateway::Lease lease, std::string error) {
    got.set_value({lease != nullptr, error});
  });
  auto fut = got.get_future();
  REQUIRE(fut.wait_for(std::chrono::seconds(20)) == std::future_status::ready);
  auto [leased, error] = fut.get();
  CHECK_FALSE(leased);
  CHECK(error.find("switch to a failed: ") == 0);
  CHECK(error.find("disk I/O error (injected)") != std::string::npos);
  auto s = sup.snapshot();
  CHECK(s.state == SlotState::failed);
  CHECK(s.last_error.find("disk I/O error (injected)") != std::string::npos);
  CHECK(f.daemon_log.any("error: switch to a failed:"));
  bool event = false;
  for (const auto& e : f.store->recent_events(20))
    if (e["kind"] == "error" && e["detail"].value("why", "").find("injected") != std::string::npos) event = true;
  CHECK(event);
  CHECK(f.store->recent_launches(5).empty());  // nothing was launched

  exec_sql(f, "DROP TRIGGER sd_fail;");
  auto ok = sup.switch_to("a");  // the next operation starts over
  REQUIRE_MESSAGE(ok.ok, ok.error);
  CHECK(sup.snapshot().state == SlotState::ready);
}

TEST_CASE("failure: a store error after the engine was spawned stops that engine; nothing runs unrecorded") {
  Fixture f;
  f.add("a");
  auto& sup = f.make();
  exec_sql(f,
           "CREATE TRIGGER sd_fail BEFORE UPDATE ON launches WHEN OLD.pid = 0 AND NEW.pid != 0 "
           "BEGIN SELECT RAISE(ABORT, 'database or disk is full (injected)'); END;");
  auto r = sup.switch_to("a");
  CHECK_FALSE(r.ok);
  CHECK(r.error.find("database or disk is full (injected)") != std::string::npos);
  CHECK(sup.snapshot().state == SlotState::failed);
  CHECK(sup.snapshot().pid == 0);
  auto launches = f.store->recent_launches(5);
  REQUIRE(launches.size() == 1);
  // Every process of that launch is gone (found by its marker: the store never learnt its pid).
  supervisor::EngineIdentity id;
  id.tag = supervisor::launch_tag(f.state_dir, launches[0].id);
  CHECK(sdtest::wait_for([&] { return supervisor::launch_members(id, false).empty(); }, 5000));

  exec_sql(f, "DROP TRIGGER sd_fail;");
  auto ok = sup.switch_to("a");
  CHECK_MESSAGE(ok.ok, ok.error);
}

TEST_CASE("failure: a warm-up body with a UTF-8 character cut at the excerpt's edge fails the start with a readable reason") {
  Fixture f;
  f.add("cut", {"--completions-fail-utf8-edge"});
  f.add("good");
  auto& sup = f.make();
  auto r = sup.switch_to("cut");
  CHECK_FALSE(r.ok);
  CHECK(r.error.find("one-token warm-up failed (HTTP 500)") != std::string::npos);
  CHECK(r.error.find(std::string(40, 'x')) != std::string::npos);
  CHECK(valid_utf8_json(r.error));
  auto s = sup.snapshot();
  CHECK(s.state == SlotState::failed);
  CHECK(valid_utf8_json(s.last_error));
  CHECK_NOTHROW((void)sup.status_json().dump());  // what /admin/status serialises
  bool event = false;
  for (const auto& e : f.store->recent_events(20))
    if (e["kind"] == "error" && e["model"] == "cut") event = true;
  CHECK(event);
  auto ok = sup.switch_to("good");
  CHECK_MESSAGE(ok.ok, ok.error);
}
