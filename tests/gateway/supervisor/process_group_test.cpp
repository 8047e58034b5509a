#include "gateway/supervisor/process_group.hpp"

#include <doctest/doctest.h>
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include "gateway/supervisor/launch_log.hpp"
#include "test_util.hpp"

using namespace servedeck::supervisor;
using namespace std::chrono_literals;

namespace {
std::shared_ptr<EngineProcess> start_fake(const std::string& dir, std::vector<std::string> args, int& log_fd,
                                          const std::string& tag = "") {
  log_fd = ::open((dir + "/engine.log").c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  REQUIRE(log_fd >= 0);
  std::vector<std::string> argv{sdtest::fake_engine(), "--port", "0"};
  argv.insert(argv.end(), args.begin(), args.end());
  return EngineProcess::spawn({sdtest::fake_engine(), argv, {{"SD_TEST_VAR", "1"}}, log_fd, tag, nullptr});
}

bool log_contains(const std::string& dir, const std::string& needle, int timeout_ms = 5000) {
  return sdtest::wait_for([&] { return tail_lines(dir + "/engine.log", 50).find(needle) != std::string::npos; },
                          timeout_ms);
}
}  // namespace

TEST_CASE("proc: parse_proc_stat handles a comm with spaces and parentheses") {
  std::string line = "4242 (vllm (Engine) 1) S 1 4242 4242 0 -1 4194560 100 0 0 0 5 6 0 0 20 0 3 0 987654 1000 10";
  auto s = parse_proc_stat(line);
  REQUIRE(s);
  CHECK(s->pid == 4242);
  CHECK(s->comm == "vllm (Engine) 1");
  CHECK(s->state == 'S');
  CHECK(s->ppid == 1);
  CHECK(s->pgid == 4242);
  CHECK(s->sid == 4242);
  CHECK(s->start_time == 987654u);
  CHECK_FALSE(parse_proc_stat("garbage"));
  CHECK_FALSE(parse_proc_stat("12 (x) S 1 2"));
}

TEST_CASE("proc: our own stat and VmRSS are readable") {
  auto s = read_proc_stat(getpid());
  REQUIRE(s);
  CHECK(s->pid == getpid());
  CHECK(s->start_time > 0);
  auto rss = read_vm_rss_kib(getpid());
  REQUIRE(rss);
  CHECK(*rss > 0);
  CHECK_FALSE(read_proc_stat(0x7ffffff0));
}

TEST_CASE("process group: the engine runs in its own session (pid == pgid == sid)") {
  auto dir = sdtest::temp_dir("pg");
  int fd = -1;
  auto e = start_fake(dir, {}, fd);
  sdtest::KillOnExit guard{e};
  REQUIRE(log_contains(dir, "listening on"));
  auto st = read_proc_stat(e->pid());
  REQUIRE(st);
  CHECK(st->pgid == e->pid());
  CHECK(st->sid == e->pid());
  CHECK(e->start_time() == st->start_time);
  CHECK(e->running());
  auto r = terminate(*e, 5s, 2s);
  CHECK(r.clean());
  CHECK_FALSE(r.sigkill_sent);
  REQUIRE(r.exit_status);
  CHECK(*r.exit_status == 128 + SIGTERM);
  CHECK_FALSE(e->running());
  ::close(fd);
  std::filesystem::remove_all(dir);
}

TEST_CASE("process group: spawning a missing program fails with its name") {
  try {
    EngineProcess::spawn({"/nonexistent/engine", {"/nonexistent/engine"}, {}, -1});
    FAIL("expected SpawnError");
  } catch (const SpawnError& e) {
    CHECK(std::string(e.what()).find("/nonexistent/engine") != std::string::npos);
  }
}

TEST_CASE("process group: SIGTERM ignored -> the group is SIGKILLed after the grace") {
  auto dir = sdtest::temp_dir("pg");
  int fd = -1;
  auto e = start_fake(dir, {"--ignore-sigterm"}, fd);
  sdtest::KillOnExit guard{e};
  REQUIRE(log_contains(dir, "listening on"));
  std::vector<std::string> lines;
  auto t0 = std::chrono::steady_clock::now();
  auto r = terminate(*e, 500ms, 3s, [&](const std::string& s) { lines.push_back(s); });
  CHECK(std::chrono::steady_clock::now() - t0 >= 500ms);
  CHECK(r.sigkill_sent);
  CHECK(r.clean());
  REQUIRE(r.exit_status);
  CHECK(*r.exit_status == 128 + SIGKILL);
  CHECK_FALSE(sdtest::alive(e->pid()));
  REQUIRE(lines.size() >= 2);
  CHECK(lines[1].find("SIGKILL") != std::string::npos);
  ::close(fd);
  std::filesystem::remove_all(dir);
}

TEST_CASE("process group: a grandchild in the same group, and one that called setpgid, are both reaped") {
  for (std::string mode : {"session", "setpgid"}) {
    CAPTURE(mode);
    auto dir = sdtest::temp_dir("pg");
    int fd = -1;
    std::string pid_file = dir + "/grandchild.pid";
    auto e = start_fake(dir, {"--fork-grandchild", mode, "--grandchild-pid-file", pid_file}, fd);
    sdtest::KillOnExit guard{e};
    int64_t gc = sdtest::read_pid_file(pid_file);
    REQUIRE(gc > 0);
    REQUIRE(log_contains(dir, "listening on"));
    auto gst = read_proc_stat(gc);
    REQUIRE(gst);
    CHECK(gst->sid == e->pid());
    if (mode == "setpgid") CHECK(gst->pgid == gc);
    else CHECK(gst->pgid == e->pid());
    auto members = e->members();
    CHECK(members.size() == 2);
    auto r = terminate(*e, 3s, 3s);
    CHECK(r.clean());
    CHECK_FALSE(sdtest::alive(gc));
    CHECK_FALSE(sdtest::alive(e->pid()));
    CHECK(std::find(r.pids_seen.begin(), r.pids_seen.end(), gc) != r.pids_seen.end());
    ::close(fd);
    std::filesystem::remove_all(dir);
  }
}

TEST_CASE("process group: adopt checks pid AND start time; orphans of a dead leader are killed by their marker") {
  auto dir = sdtest::temp_dir("pg");
  int fd = -1;
  std::string pid_file = dir + "/grandchild.pid";
  const std::string tag = launch_tag(dir, 7);
  auto e = start_fake(dir, {"--fork-grandchild", "setpgid", "--grandchild-pid-file", pid_file}, fd, tag);
  sdtest::KillOnExit guard{e};
  int64_t gc = sdtest::read_pid_file(pid_file);
  REQUIRE(gc > 0);
  REQUIRE(log_contains(dir, "listening on"));
  CHECK_FALSE(EngineProcess::adopt(e->pid(), e->start_time() + 1));
  auto adopted = EngineProcess::adopt(e->pid(), e->start_time());
  REQUIRE(adopted);
  CHECK(adopted->adopted());
  CHECK(adopted->running());
  // The leader dies alone (SIGKILL to the pid only): its setpgid'ed grandchild is an orphan.
  ::kill(static_cast<pid_t>(e->pid()), SIGKILL);
  CHECK(e->wait_exit(3s));
  CHECK(adopted->wait_exit(3s));
  CHECK_FALSE(adopted->exit_status().has_value());  // not our child: status unknown
  REQUIRE(sdtest::alive(gc));
  CHECK(has_launch_marker(gc, tag));
  EngineIdentity id{e->pid(), e->start_time(), tag, nullptr};
  auto r = terminate_orphans(id, 2s, 2s);
  CHECK(r.clean());
  CHECK_FALSE(sdtest::alive(gc));
  ::close(fd);
  std::filesystem::remove_all(dir);
}

TEST_CASE("process group: the engine gets only stdin, stdout, stderr and the extra environment") {
  auto dir = sdtest::temp_dir("pg");
  std::string marker = dir + "/leak-marker";
  int leak = ::open(marker.c_str(), O_RDWR | O_CREAT, 0600);  // not CLOEXEC: must still not reach the engine
  REQUIRE(leak >= 0);
  int fd = -1;
  auto e = start_fake(dir, {}, fd);
  sdtest::KillOnExit guard{e};
  REQUIRE(log_contains(dir, "listening on"));
  int engine_fds = 0;
  for (const auto& f : std::filesystem::directory_iterator("/proc/" + std::to_string(e->pid()) + "/fd")) {
    ++engine_fds;
    std::error_code ec;
    auto target = std::filesystem::read_symlink(f.path(), ec).string();
    CHECK(target != marker);
    if (f.path().filename() == "0") CHECK(target == "/dev/null");
    if (f.path().filename() == "1") CHECK(target == dir + "/engine.log");
  }
  CHECK(engine_fds >= 3);
  std::ifstream env("/proc/" + std::to_string(e->pid()) + "/environ");
  std::string all((std::istreambuf_iterator<char>(env)), {});
  CHECK(all.find("SD_TEST_VAR=1") != std::string::npos);
  terminate(*e, 3s, 2s);
  ::close(leak);
  ::close(fd);
  std::filesystem::remove_all(dir);
}
