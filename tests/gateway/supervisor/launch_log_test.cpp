#include "gateway/supervisor/launch_log.hpp"

#include <doctest/doctest.h>
#include <unistd.h>

#include <fstream>

#include "test_util.hpp"

using namespace servedeck::supervisor;
namespace fs = std::filesystem;

TEST_CASE("launch log: per-launch files, keep N per model, tail") {
  auto dir = sdtest::temp_dir("log");
  for (int id = 1; id <= 4; ++id) {
    LaunchLog log(dir, "tiny", id, 1 << 20, 2);
    CHECK(log.path() == dir + "/logs/tiny-" + std::to_string(id) + ".log");
    log.note("launch " + std::to_string(id));
  }
  LaunchLog other(dir, "tiny2", 5, 1 << 20, 2);  // another model's logs are not counted
  auto kept = launch_logs_of(dir + "/logs", "tiny");
  REQUIRE(kept.size() == 2);
  CHECK(kept[0] == dir + "/logs/tiny-3.log");
  CHECK(kept[1] == dir + "/logs/tiny-4.log");
  CHECK(launch_logs_of(dir + "/logs", "tiny2").size() == 1);
  CHECK(tail_lines(kept[1], 5) == "servedeck: launch 4");
  fs::remove_all(dir);
}

TEST_CASE("launch log: bounded by copy-truncate; the writer keeps appending; tail spans the rotation") {
  auto dir = sdtest::temp_dir("log");
  LaunchLog log(dir, "m", 1, 1000, 5);
  for (int i = 0; i < 40; ++i) {
    std::string line = "line " + std::to_string(i) + " " + std::string(30, '.') + "\n";
    REQUIRE(::write(log.fd(), line.data(), line.size()) == static_cast<ssize_t>(line.size()));
  }
  int64_t before = log.bytes_written();
  CHECK(before > 1000);
  CHECK(log.enforce_bound());
  CHECK(fs::file_size(log.path()) == 0);
  CHECK(fs::exists(log.path() + ".1"));
  CHECK(log.bytes_written() == before);  // progress measure does not go backwards
  std::string more = "after rotation\n";
  REQUIRE(::write(log.fd(), more.data(), more.size()) == static_cast<ssize_t>(more.size()));
  CHECK(fs::file_size(log.path()) == more.size());  // O_APPEND: continues at the new end
  CHECK(log.bytes_written() == before + static_cast<int64_t>(more.size()));
  std::string tail = tail_lines(log.path(), 3);
  CHECK(tail.find("line 39") != std::string::npos);
  CHECK(tail.find("after rotation") != std::string::npos);
  CHECK(tail.find("line 37") == std::string::npos);
  CHECK_FALSE(log.enforce_bound());
  CHECK(tail_lines(dir + "/missing.log", 5).empty());
  fs::remove_all(dir);
}
