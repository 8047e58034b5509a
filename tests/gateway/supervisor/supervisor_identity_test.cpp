// The supervisor and engine identity: a setsid() grandchild holding the engine's port is stopped
// with it; a start on a held port names the holder; recovery adopts only the launch models.toml
// still renders and never signals a process that merely carries a dead engine's session id; a
// dead engine's handle is dropped; the reaper uses only the slot's own globs.
#include <doctest/doctest.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>

#include <fstream>

#include "gateway/supervisor/supervisor.hpp"
#include "supervisor_fixture.hpp"

extern char** environ;

using namespace servedeck;
using gateway::SlotState;
using sdtest::Fixture;
using sdtest::Lines;

namespace {

/// A TCP port on 127.0.0.1 that was free a moment ago.
int pick_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

void touch(const std::string& path) { std::ofstream(path) << std::string(4096, 'x'); }

}  // namespace

TEST_CASE("identity: a grandchild that called setsid() and holds the port is stopped; the next start gets the port") {
  for (bool cgroups : {true, false}) {
    CAPTURE(cgroups);
    Fixture f;
    if (!cgroups) f.cgroup_parent = "";  // the marker alone must find it
    std::string gc_file = f.state_dir + "/gc.pid";
    auto& m = f.add("a", {"--fork-grandchild", "setsid", "--grandchild-pid-file", gc_file});
    m.port = pick_port();
    auto& sup = f.make();
    auto r = sup.switch_to("a");
    REQUIRE_MESSAGE(r.ok, r.error);
    int64_t pid = sup.snapshot().pid;
    int64_t gc = sdtest::read_pid_file(gc_file);
    REQUIRE(gc > 0);
    REQUIRE(sdtest::wait_for([&] {  // left the engine's session (once its setsid() ran)
      auto st = servedeck::supervisor::read_proc_stat(gc);
      return st && st->sid == gc;
    }, 5000));
    CHECK(sup.status_json()["processes"] == 2);
    auto stop = sup.stop("test");
    REQUIRE_MESSAGE(stop.ok, stop.error);
    CHECK_FALSE(sdtest::alive(pid));
    CHECK_FALSE(sdtest::alive(gc));
    std::filesystem::remove(gc_file);
    auto again = sup.switch_to("a");  // the same fixed port: free again
    CHECK_MESSAGE(again.ok, again.error);
  }
}

TEST_CASE("identity: a start on a port someone else holds names the holder instead of the engine's bind error") {
  Fixture f;
  int s = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  REQUIRE(::listen(s, 4) == 0);
  socklen_t len = sizeof a;
  ::getsockname(s, reinterpret_cast<sockaddr*>(&a), &len);
  auto& m = f.add("a");
  m.port = ntohs(a.sin_port);
  auto& sup = f.make();
  auto r = sup.switch_to("a");
  CHECK_FALSE(r.ok);
  CHECK(r.error.find("port " + std::to_string(m.port) + " is held by pid " + std::to_string(getpid()) + " (") !=
        std::string::npos);
  CHECK(r.error.find("test_gateway_supervisor") != std::string::npos);  // the holder's command line
  CHECK(sup.snapshot().state == SlotState::failed);
  ::close(s);
  auto ok = sup.switch_to("a");
  CHECK_MESSAGE(ok.ok, ok.error);
}

TEST_CASE("identity: an engine killed by a signal is described by it, and the monitor drops its handle") {
  Fixture f;
  f.add("a");
  auto& sup = f.make();
  REQUIRE(sup.switch_to("a").ok);
  int64_t pid = sup.snapshot().pid;
  ::kill(static_cast<pid_t>(pid), SIGKILL);
  REQUIRE(sdtest::wait_for([&] { return sup.snapshot().state == SlotState::failed; }, 5000));
  auto s = sup.snapshot();
  // The first line names the signal, not the shell-style status 137 (the log tail after it may hold
  // any digits: ports, pids, timestamps).
  const std::string first_line = s.last_error.substr(0, s.last_error.find('\n'));
  CHECK(first_line == "engine a (pid " + std::to_string(pid) + ") was killed by signal 9 (SIGKILL) after ready");
  REQUIRE(sdtest::wait_for([&] { return sup.snapshot().pid == 0; }, 5000));  // the dead engine's handle is gone
  auto st = sup.status_json();
  CHECK(st["exit_reason"] == "killed by signal 9 (SIGKILL)");
  CHECK(st["exit_status"] == 137);
  CHECK(st["last_pid"] == pid);
  CHECK(sup.switch_to("a").ok);
}

TEST_CASE("identity: recovery adopts only the launch models.toml still renders; a changed one is stopped with the reason") {
  Fixture f;
  f.add("a");
  auto& sup1 = f.make();
  REQUIRE(sup1.switch_to("a").ok);
  auto s1 = sup1.snapshot();
  f.sup.reset();  // the daemon dies; the engine runs on
  REQUIRE(sdtest::alive(s1.pid));
  f.reg.models[0].args.push_back("--chunks");  // models.toml edited meanwhile
  f.reg.models[0].args.push_back("7");
  auto& sup2 = f.make();
  Lines lines;
  sup2.recover(lines.sink());
  INFO(lines.all());
  CHECK(sup2.snapshot().state == SlotState::stopped);
  CHECK(sdtest::wait_for([&] { return !sdtest::alive(s1.pid); }, 5000));
  auto rec = f.store->launch(s1.launch_id);
  REQUIRE(rec);
  CHECK(rec->state == "stopped");
  CHECK(rec->why.find("models.toml changed since launch " + std::to_string(s1.launch_id)) != std::string::npos);
  CHECK(rec->why.find("argv+env hash") != std::string::npos);
  CHECK(rec->why.find("was (absent), models.toml now renders \"--chunks\"") != std::string::npos);
  CHECK_FALSE(lines.any("adopting a"));
}

TEST_CASE("identity: recovery never signals a process that only carries the dead engine's session id") {
  Fixture f;
  f.add("a");
  // The recorded engine pid is gone and its number now leads someone else's session: sh starts
  // `sleep` in a new session and exits, leaving a process whose sid is the dead pid.
  const std::string pid_file = f.state_dir + "/sleep.pid";
  const std::string script = "sleep 30 & echo $! > " + pid_file + ".tmp && mv " + pid_file + ".tmp " + pid_file;
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSID);
  const char* argv[] = {"/bin/sh", "-c", script.c_str(), nullptr};
  pid_t sh = 0;
  REQUIRE(posix_spawn(&sh, "/bin/sh", nullptr, &attr, const_cast<char* const*>(argv), environ) == 0);
  posix_spawnattr_destroy(&attr);
  int64_t sleeper = sdtest::read_pid_file(pid_file);
  int status = 0;
  ::waitpid(sh, &status, 0);
  REQUIRE(sleeper > 0);
  auto st = servedeck::supervisor::read_proc_stat(sleeper);
  REQUIRE(st);
  REQUIRE(st->sid == sh);

  state::LaunchRecord rec;
  rec.model = "a";
  rec.pid = sh;
  rec.pid_start_time = 1;
  rec.state = "ready";
  rec.start_ms = state::now_ms();
  rec.id = f.store->begin_launch(rec);
  auto& sup = f.make();
  Lines lines;
  sup.recover(lines.sink());
  INFO(lines.all());
  CHECK(sdtest::alive(sleeper));  // a kill(-sid) would have reached it
  auto after = f.store->launch(rec.id);
  REQUIRE(after);
  CHECK(after->state == "stopped");
  CHECK(after->why.find("gone at daemon start") != std::string::npos);
  ::kill(static_cast<pid_t>(sleeper), SIGKILL);
}

TEST_CASE("shm reaper: a switch reaps only the slot's own models' globs, never another model's files") {
  Fixture f;
  auto& a = f.add("a");
  a.shm_globs = {"/dev/shm/sdtest-a-*"};
  auto& b = f.add("b");
  b.shm_globs = {"/dev/shm/sdtest-b-*"};
  auto& c = f.add("c");
  c.shm_globs = {"/dev/shm/sdtest-c-*"};
  touch(f.shm_dir + "/sdtest-a-left");
  touch(f.shm_dir + "/sdtest-c-other");  // c never ran on this slot here: not this switch's to free
  auto& sup = f.make();
  REQUIRE(sup.switch_to("a").ok);
  CHECK_FALSE(std::filesystem::exists(f.shm_dir + "/sdtest-a-left"));
  CHECK(std::filesystem::exists(f.shm_dir + "/sdtest-c-other"));
  touch(f.shm_dir + "/sdtest-a-again");
  REQUIRE(sup.switch_to("b").ok);  // stops a: a's and b's globs
  CHECK_FALSE(std::filesystem::exists(f.shm_dir + "/sdtest-a-again"));
  CHECK(std::filesystem::exists(f.shm_dir + "/sdtest-c-other"));
}
