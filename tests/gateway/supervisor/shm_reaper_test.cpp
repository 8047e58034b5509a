#include "gateway/supervisor/shm_reaper.hpp"

#include <doctest/doctest.h>
#include <fcntl.h>
#include <unistd.h>

#include <fstream>

#include "gateway/supervisor/launch_log.hpp"
#include "gateway/supervisor/process_group.hpp"
#include "test_util.hpp"

using namespace servedeck::supervisor;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

namespace {
void write_file(const std::string& path, std::size_t bytes) {
  std::ofstream f(path, std::ios::binary);
  std::string data(bytes, 'x');
  f << data;
}
bool has(const std::vector<KeptFile>& v, const std::string& path, const std::string& why_part) {
  for (const auto& k : v)
    if (k.path == path && k.why.find(why_part) != std::string::npos) return true;
  return false;
}
}  // namespace

TEST_CASE("shm reaper: unlinks only unheld files matching the globs, and only once unmapped") {
  auto shm = sdtest::temp_dir("shm");
  auto logs = sdtest::temp_dir("shmlog");
  const std::string mapped = shm + "/sdtest-kv-mapped";
  const std::string open_fd = shm + "/sdtest-kv-open";
  const std::string loose = shm + "/sdtest-kv-loose";
  const std::string other = shm + "/other-buffer";
  const std::string link = shm + "/sdtest-kv-link";
  write_file(open_fd, 8192);
  write_file(loose, 16384);
  write_file(other, 4096);
  fs::create_symlink(other, link);
  int held_fd = ::open(open_fd.c_str(), O_RDONLY);
  REQUIRE(held_fd >= 0);

  int log_fd = ::open((logs + "/engine.log").c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  auto engine = EngineProcess::spawn({sdtest::fake_engine(),
                                      {sdtest::fake_engine(), "--hold-shm", mapped, "--hold-shm-bytes", "65536"},
                                      {},
                                      log_fd});
  sdtest::KillOnExit guard{engine};
  REQUIRE(sdtest::wait_for([&] { return tail_lines(logs + "/engine.log", 20).find("listening") != std::string::npos; },
                           5000));

  std::vector<std::string> globs{"/dev/shm/sdtest-kv-*", "/var/tmp/not-shm-*"};
  auto r = reap_shm(globs, shm);
  CAPTURE(r.summary());
  REQUIRE(r.freed.size() == 1);
  CHECK(r.freed[0].path == loose);
  CHECK(r.freed[0].bytes >= 16384);
  CHECK(r.freed_bytes() == r.freed[0].bytes);
  CHECK(has(r.kept, mapped, "mapped by pid " + std::to_string(engine->pid())));
  CHECK(has(r.kept, open_fd, "open in pid " + std::to_string(getpid())));
  REQUIRE(r.ignored_globs.size() == 1);
  CHECK(r.ignored_globs[0].rfind("/var/tmp/not-shm-* (not a file directly in", 0) == 0);
  CHECK(fs::exists(mapped));
  CHECK(fs::exists(open_fd));
  CHECK_FALSE(fs::exists(loose));
  CHECK(fs::exists(other));
  CHECK(fs::is_symlink(link));  // never follows or removes symlinks
  CHECK(r.summary().find("reaped 1 file") != std::string::npos);
  // Strict mode keeps whatever a process we could not read might hold (only meaningful where
  // some process of the file owner's uid hides its /proc entries, e.g. pid 1 in some sandboxes).
  if (!r.unverified.empty()) {
    const std::string strict_file = shm + "/sdtest-kv-strict";
    write_file(strict_file, 100);
    auto strict = reap_shm(globs, shm, "/proc", /*keep_unverifiable=*/true);
    if (strict.freed.empty()) CHECK(fs::exists(strict_file));
    fs::remove(strict_file);
  }

  // Still mapped: a second pass keeps it.
  auto again = reap_shm(globs, shm);
  CHECK(again.freed.empty());

  terminate(*engine, 3s, 2s);
  ::close(held_fd);
  auto after = reap_shm(globs, shm);
  CAPTURE(after.summary());
  CHECK(after.freed.size() == 2);
  CHECK(after.freed_bytes() >= 65536 + 8192);
  CHECK_FALSE(fs::exists(mapped));
  CHECK_FALSE(fs::exists(open_fd));
  CHECK(fs::exists(other));
  CHECK(fs::is_symlink(link));
  ::close(log_fd);
  fs::remove_all(shm);
  fs::remove_all(logs);
}

TEST_CASE("shm reaper: bare name patterns and an unreadable directory") {
  auto shm = sdtest::temp_dir("shm");
  write_file(shm + "/flashnext-kv-0", 100);
  auto r = reap_shm({"flashnext-kv-*", "sub/dir-*"}, shm);
  CHECK(r.freed.size() == 1);
  CHECK(r.ignored_globs.size() == 1);
  auto missing = reap_shm({"xyz-*"}, shm + "/nope");
  REQUIRE(missing.errors.size() == 1);
  CHECK(missing.errors[0].find(shm + "/nope") != std::string::npos);
  fs::remove_all(shm);
}
