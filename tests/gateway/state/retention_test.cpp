// Stored data has a lifetime: Store::prune, the Janitor that runs it, the modes of the database
// files and of the state directory.
#include <doctest/doctest.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "gateway/state/janitor.hpp"
#include "gateway/state/state_dir.hpp"
#include "gateway/state/store.hpp"

using namespace servedeck::state;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

namespace {

std::string temp_dir() {
  std::string t = (fs::temp_directory_path() / "sd-retention-XXXXXX").string();
  REQUIRE(mkdtemp(t.data()) != nullptr);
  return t;
}

unsigned mode_of(const std::string& path) {
  struct stat st {};
  REQUIRE(::stat(path.c_str(), &st) == 0);
  return st.st_mode & 07777u;
}

std::string bytes_of(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

RequestRecord request_at(int64_t t) {
  RequestRecord r;
  r.time_ms = t;
  r.route = "/v1/chat/completions";
  r.model = "m";
  r.status = 200;
  return r;
}

/// Sets an environment variable for the scope of the object.
struct ScopedEnv {
  std::string name;
  ScopedEnv(std::string n, const std::string& value) : name(std::move(n)) { ::setenv(name.c_str(), value.c_str(), 1); }
  ~ScopedEnv() { ::unsetenv(name.c_str()); }
};

}  // namespace

TEST_CASE("retention: state.db and its -wal/-shm are 0600, existing 0644 ones are fixed at open") {
  auto dir = temp_dir();
  {
    Store s(dir);
    s.add_event("switch", "m", {{"x", 1}});
    CHECK(mode_of(dir + "/state.db") == 0600);
    CHECK(mode_of(dir + "/state.db-wal") == 0600);
    CHECK(mode_of(dir + "/state.db-shm") == 0600);
  }
  // What an older servedeck left: world-readable files.
  for (const char* f : {"/state.db", "/state.db-wal", "/state.db-shm"})
    if (fs::exists(dir + f)) ::chmod((dir + f).c_str(), 0644);
  {
    Store s(dir);
    CHECK(s.recent_events(1).size() == 1);
    for (const char* f : {"/state.db", "/state.db-wal", "/state.db-shm"}) {
      CAPTURE(f);
      CHECK(mode_of(dir + f) == 0600);
    }
  }
  fs::remove_all(dir);
}

TEST_CASE("retention: prune deletes expired documents and leaves their text nowhere in the files") {
  auto dir = temp_dir();
  Store s(dir);
  const int64_t now = now_ms();
  s.put_document("responses", "resp_old", {{"messages", "SECRET-CONVERSATION-7f3a"}}, now - 1000);
  s.put_document("responses", "resp_live", {{"messages", "still wanted"}}, now + 3600 * 1000);
  s.put_document("reasoning", "call_old", "old thought", now - 1);
  s.put_document("notes", "forever", "kept", 0);
  auto n = s.prune({}, now);
  CHECK(n.documents == 2);
  CHECK_FALSE(s.get_document("responses", "resp_old"));
  CHECK(s.get_document("responses", "resp_live"));
  CHECK(s.get_document("notes", "forever"));
  // secure_delete zeroes the freed pages and the truncating checkpoint empties the WAL.
  std::string all = bytes_of(dir + "/state.db") + bytes_of(dir + "/state.db-wal");
  CHECK(all.find("SECRET-CONVERSATION-7f3a") == std::string::npos);
  fs::remove_all(dir);
}

TEST_CASE("retention: a shorter responses retention applies to turns already stored; 0 removes them all") {
  auto dir = temp_dir();
  Store s(dir);
  const int64_t now = now_ms();
  s.put_document("responses", "week", {{"m", 1}}, now + 7ll * 24 * 3600 * 1000);
  s.put_document("responses", "never_expiring", {{"m", 2}}, 0);
  s.put_document("responses", "soon", {{"m", 3}}, now + 1000);
  s.put_document("other", "week", {{"m", 4}}, now + 7ll * 24 * 3600 * 1000);
  Retention one_hour;
  one_hour.responses_max_ms = 3600 * 1000;
  CHECK(s.prune(one_hour, now).documents == 0);
  // An hour and a second later the clamped turns are gone, the one expiring sooner long before.
  CHECK(s.prune({}, now + 3601 * 1000).documents == 3);
  CHECK_FALSE(s.get_document("responses", "week"));
  CHECK_FALSE(s.get_document("responses", "never_expiring"));
  CHECK(s.get_document("other", "week"));  // only the responses namespace is clamped
  s.put_document("responses", "again", {{"m", 5}}, now + 1000 * 1000);
  Retention none;
  none.responses_max_ms = 0;
  CHECK(s.prune(none, now).documents == 1);
  CHECK_FALSE(s.get_document("responses", "again"));
  fs::remove_all(dir);
}

TEST_CASE("retention: the request log and the events table are bounded by age and by rows") {
  auto dir = temp_dir();
  Store s(dir);
  const int64_t now = now_ms();
  const int64_t day = 24ll * 3600 * 1000;
  for (int i = 0; i < 5; ++i) s.add_request(request_at(now - 40 * day + i));  // older than 30 days
  for (int i = 19; i >= 0; --i) s.add_request(request_at(now - i * 1000));
  for (int i = 0; i < 12; ++i) s.add_event("switch", "m", {{"i", i}});
  Retention r;
  r.history_max_age_ms = 30 * day;
  r.history_max_rows = 10;
  auto n = s.prune(r, now);
  CHECK(n.requests == 15);  // 5 by age, then 10 of the remaining 20 by rows
  CHECK(n.events == 2);
  CHECK(s.count_requests("/v1/chat/completions") == 10);
  CHECK(s.count_events() == 10);
  auto kept = s.recent_requests(100);
  REQUIRE(kept.size() == 10);
  CHECK(kept.front().time_ms == now);  // the newest are kept
  CHECK(s.recent_events(1).front()["detail"]["i"] == 11);
  // Nothing more to do: a second prune deletes nothing.
  CHECK(s.prune(r, now).total() == 0);
  fs::remove_all(dir);
}

TEST_CASE("retention: the Janitor sweeps at start and then periodically, and stops promptly") {
  auto dir = temp_dir();
  Store s(dir);
  s.put_document("responses", "expired", {{"m", 1}}, now_ms() - 1);
  std::mutex mu;
  std::vector<std::string> lines;
  std::atomic<int> also{0};
  {
    Retention r;
    r.history_max_rows = 3;
    Janitor j(s, r, 50ms, [&](const std::string& l) {
      std::lock_guard lk(mu);
      lines.push_back(l);
    }, [&] { ++also; });
    // The sweep at construction already ran: the expired turn is gone before anything else.
    CHECK(j.runs() >= 1);
    CHECK(also >= 1);
    CHECK_FALSE(s.get_document("responses", "expired"));
    // Rows added later are bounded by a later sweep.
    for (int i = 0; i < 6; ++i) s.add_event("switch", "m", {{"i", i}});
    auto deadline = std::chrono::steady_clock::now() + 5s;
    while ((s.count_events() > 3 || j.runs() < 2) && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(5ms);
    CHECK(s.count_events() == 3);
    CHECK(j.runs() >= 2);
  }
  std::lock_guard lk(mu);
  REQUIRE_FALSE(lines.empty());
  CHECK(lines.front().find("deleted 1 expired stored document(s)") != std::string::npos);
  // A one-hour interval: the destructor does not wait for it.
  auto t0 = std::chrono::steady_clock::now();
  { Janitor slow(s, {}, std::chrono::hours(1), nullptr); }
  CHECK(std::chrono::steady_clock::now() - t0 < 2s);
  fs::remove_all(dir);
}

TEST_CASE("retention: the state directory is created 0700 and an existing one is tightened") {
  auto root = temp_dir();
  const std::string dir = root + "/state";
  CHECK(secure_state_dir(dir) == "");
  CHECK(mode_of(dir) == 0700);
  ::chmod(dir.c_str(), 0755);
  CHECK(secure_state_dir(dir) == "state directory " + dir + " was 0755; now 0700");
  CHECK(mode_of(dir) == 0700);
  {
    // Under systemd's StateDirectory= the unit's group may traverse (0710), nothing more.
    ScopedEnv env("STATE_DIRECTORY", dir);
    ::chmod(dir.c_str(), 0750);
    CHECK(secure_state_dir(dir) == "state directory " + dir + " was 0750; now 0710");
    CHECK(mode_of(dir) == 0710);
    CHECK(secure_state_dir(dir) == "");
    CHECK_FALSE(systemd_state_dir_mismatch(dir, "/etc/servedeck/models.toml"));
    CHECK_FALSE(systemd_state_dir_mismatch(dir + "/", "/etc/servedeck/models.toml"));
    auto other = systemd_state_dir_mismatch(root + "/elsewhere", "/etc/servedeck/models.toml");
    REQUIRE(other);
    CHECK(other->find("StateDirectory is " + dir) != std::string::npos);
    CHECK(other->find("set state_dir = \"" + dir + "\" in /etc/servedeck/models.toml") != std::string::npos);
  }
  CHECK_FALSE(systemd_state_dir_mismatch(root + "/elsewhere", "x"));  // no unit: nothing to agree with
  std::ofstream(root + "/file") << "x";
  CHECK_THROWS_AS(secure_state_dir(root + "/file"), StoreError);
  fs::remove_all(root);
}
