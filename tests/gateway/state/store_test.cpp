#include "gateway/state/store.hpp"

#include <doctest/doctest.h>
#include <sqlite3.h>
#include <stdlib.h>

#include <filesystem>
#include <string>

using namespace servedeck::state;

namespace {
std::string temp_dir() {
  std::string t = (std::filesystem::temp_directory_path() / "sd-store-XXXXXX").string();
  REQUIRE(mkdtemp(t.data()) != nullptr);
  return t;
}

std::string query_text(const std::string& db_path, const char* sql) {
  sqlite3* db = nullptr;
  REQUIRE(sqlite3_open(db_path.c_str(), &db) == SQLITE_OK);
  sqlite3_stmt* st = nullptr;
  REQUIRE(sqlite3_prepare_v2(db, sql, -1, &st, nullptr) == SQLITE_OK);
  std::string out;
  if (sqlite3_step(st) == SQLITE_ROW) out = reinterpret_cast<const char*>(sqlite3_column_text(st, 0));
  sqlite3_finalize(st);
  sqlite3_close(db);
  return out;
}
}  // namespace

TEST_CASE("store: schema is versioned and WAL") {
  auto dir = temp_dir();
  {
    Store s(dir);
    CHECK(s.path() == dir + "/state.db");
  }
  CHECK(query_text(dir + "/state.db", "SELECT version FROM schema_version") ==
        std::to_string(Store::k_schema_version));
  CHECK(query_text(dir + "/state.db", "PRAGMA journal_mode") == "wal");
  // Reopening does not re-run migrations (would fail on CREATE TABLE).
  Store again(dir);
  CHECK(again.recent_launches(10).empty());
  std::filesystem::remove_all(dir);
}

TEST_CASE("store: a newer schema is refused with both versions named") {
  auto dir = temp_dir();
  { Store s(dir); }
  {
    sqlite3* db = nullptr;
    REQUIRE(sqlite3_open((dir + "/state.db").c_str(), &db) == SQLITE_OK);
    REQUIRE(sqlite3_exec(db, "UPDATE schema_version SET version = 99", nullptr, nullptr, nullptr) == SQLITE_OK);
    sqlite3_close(db);
  }
  try {
    Store s(dir);
    FAIL("expected StoreError");
  } catch (const StoreError& e) {
    std::string msg = e.what();
    CHECK(msg.find("99") != std::string::npos);
    CHECK(msg.find(std::to_string(Store::k_schema_version)) != std::string::npos);
  }
  std::filesystem::remove_all(dir);
}

TEST_CASE("store: launches round-trip and adoption candidates") {
  auto dir = temp_dir();
  Store s(dir);
  LaunchRecord r;
  r.model = "glm53";
  r.argv = {"/usr/bin/vllm", "serve", "--port", "8000"};
  r.env = {{"CUDA_VISIBLE_DEVICES", "0"}};
  r.pid = 4242;
  r.pid_start_time = 123456789;
  r.preflight = nlohmann::json::array({{{"check", "host_ram"}, {"verdict", "pass"}}});
  r.start_ms = 1000;
  r.state = "starting";
  r.log_path = dir + "/logs/glm53-1.log";
  r.port = 8000;
  r.id = s.begin_launch(r);
  CHECK(r.id > 0);

  auto got = s.launch(r.id);
  REQUIRE(got);
  CHECK(got->model == "glm53");
  CHECK(got->argv == r.argv);
  CHECK(got->env == r.env);
  CHECK(got->pid == 4242);
  CHECK(got->pid_start_time == 123456789);
  CHECK(got->preflight == r.preflight);
  CHECK_FALSE(got->exit_status.has_value());
  CHECK(got->port == 8000);
  CHECK(s.unfinished_launches().size() == 1);

  r.state = "stopped";
  r.exit_status = 137;
  r.stop_ms = 2000;
  r.why = "stopped by switch to qwen";
  s.update_launch(r);
  got = s.launch(r.id);
  REQUIRE(got);
  CHECK(got->exit_status == 137);
  CHECK(got->why == "stopped by switch to qwen");
  CHECK(s.unfinished_launches().empty());

  LaunchRecord r2 = r;
  r2.model = "qwen";
  r2.state = "ready";
  r2.exit_status.reset();
  r2.id = s.begin_launch(r2);
  CHECK(s.latest_launch()->model == "qwen");
  auto recent = s.recent_launches(5);
  REQUIRE(recent.size() == 2);
  CHECK(recent[0].id == r2.id);
  CHECK(s.unfinished_launches().size() == 1);

  LaunchRecord missing;
  missing.id = 999;
  CHECK_THROWS_AS(s.update_launch(missing), StoreError);
  std::filesystem::remove_all(dir);
}

TEST_CASE("store: events, requests, measured memory, documents") {
  auto dir = temp_dir();
  Store s(dir);
  s.add_event("switch", "glm53", {{"from", "qwen"}});
  s.add_event("reap", "", {{"freed_bytes", 1024}});
  auto ev = s.recent_events(10);
  REQUIRE(ev.size() == 2);
  CHECK(ev[0]["kind"] == "reap");
  CHECK(ev[0]["detail"]["freed_bytes"] == 1024);
  CHECK(ev[1]["model"] == "glm53");

  RequestRecord q;
  q.route = "/v1/chat/completions";
  q.model = "glm53";
  q.alias = "glm53-flash-low";
  q.stream = true;
  q.status = 200;
  q.completion_tokens = 17;
  q.ttft_ms = 12.5;
  s.add_request(q);
  s.add_request(q);
  q.route = "/v1/completions";
  s.add_request(q);
  CHECK(s.count_requests("/v1/chat/completions") == 2);
  CHECK(s.count_requests("/v1/completions") == 1);
  auto rq = s.recent_requests(1);
  REQUIRE(rq.size() == 1);
  CHECK(rq[0].route == "/v1/completions");
  CHECK(rq[0].stream);
  CHECK(rq[0].ttft_ms == doctest::Approx(12.5));

  CHECK_FALSE(s.last_measured_memory("glm53", 327680));
  MeasuredMemory m{"glm53", 327680, "vllm 0.11", 130.5, 150.25, 61.0, 0};
  s.add_measured_memory(m);
  m.peak_vram_gib = 131.0;
  s.add_measured_memory(m);
  auto mm = s.last_measured_memory("glm53", 327680);
  REQUIRE(mm);
  CHECK(mm->peak_vram_gib == doctest::Approx(131.0));
  CHECK(mm->host_rss_gib == doctest::Approx(150.25));
  CHECK_FALSE(s.last_measured_memory("glm53", 1024));

  s.put_document("responses", "resp_1", {{"a", 1}});
  s.put_document("responses", "resp_1", {{"a", 2}});
  CHECK((*s.get_document("responses", "resp_1"))["a"] == 2);
  s.put_document("reasoning", "call_1", "thought", now_ms() - 1);  // already expired
  CHECK_FALSE(s.get_document("reasoning", "call_1"));
  CHECK_FALSE(s.get_document("nope", "x"));
  std::filesystem::remove_all(dir);
}

TEST_CASE("store: an event detail holding engine text cut inside a UTF-8 character is stored with U+FFFD") {
  // A warm-up failure quotes the first 300 bytes of the engine's body; "é" (C3 A9) at bytes
  // 299-300 leaves half a character, on which json::dump() threw type_error.316.
  auto dir = temp_dir();
  Store s(dir);
  std::string excerpt = std::string(299, 'a') + "\xc3";
  CHECK_NOTHROW(s.add_event("warmup_failed", "glm53", {{"detail", excerpt}}));
  auto ev = s.recent_events(1);
  REQUIRE(ev.size() == 1);
  CHECK(ev[0]["detail"]["detail"] == std::string(299, 'a') + "\xef\xbf\xbd");
}

TEST_CASE("store: a second connection sees the first one's writes (status with the daemon down)") {
  auto dir = temp_dir();
  Store writer(dir);
  LaunchRecord r;
  r.model = "tiny";
  r.state = "ready";
  writer.begin_launch(r);
  Store reader(dir);
  REQUIRE(reader.latest_launch());
  CHECK(reader.latest_launch()->state == "ready");
  std::filesystem::remove_all(dir);
}
