// Engine identity: a launch's cgroup and marker find a grandchild that left the session with
// setsid(); nothing that merely carries a dead leader's session id is signalled; pidfds refuse a
// reused pid; a port's holder is named; an exit by signal is described by its name.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>

#include "gateway/supervisor/engine_cgroup.hpp"
#include "gateway/supervisor/engine_identity.hpp"
#include "gateway/supervisor/holders.hpp"
#include "gateway/supervisor/launch_log.hpp"
#include "gateway/supervisor/process_group.hpp"
#include "test_util.hpp"

extern char** environ;

using namespace servedeck::supervisor;
using namespace std::chrono_literals;

namespace {

std::string own_cgroup_line(int64_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/cgroup");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("0::", 0) == 0) return line.substr(3);
  return "";
}

bool log_contains(const std::string& path, const std::string& needle) {
  return sdtest::wait_for([&] { return tail_lines(path, 50).find(needle) != std::string::npos; }, 5000);
}

}  // namespace

TEST_CASE("identity: a grandchild that left the session with setsid() is stopped (marker, and cgroup when writable)") {
  std::string why;
  auto parent = EngineCgroup::default_parent(&why);
  if (!parent) MESSAGE("no writable cgroup here (" << why << "): only the marker path runs");
  for (bool with_cgroup : {false, true}) {
    if (with_cgroup && !parent) continue;
    CAPTURE(with_cgroup);
    auto dir = sdtest::temp_dir("id");
    const std::string log = dir + "/engine.log";
    int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    REQUIRE(fd >= 0);
    const std::string tag = launch_tag(dir, with_cgroup ? 2 : 1);
    std::shared_ptr<EngineCgroup> cg;
    if (with_cgroup) {
      cg = EngineCgroup::create(*parent, launch_cgroup_name(tag), &why);
      REQUIRE_MESSAGE(cg, why);
    }
    const std::string gc_file = dir + "/gc.pid";
    auto e = EngineProcess::spawn({sdtest::fake_engine(),
                                   {sdtest::fake_engine(), "--port", "0", "--ignore-sigterm", "--fork-grandchild",
                                    "setsid", "--grandchild-pid-file", gc_file},
                                   {},
                                   fd,
                                   tag,
                                   cg});
    sdtest::KillOnExit guard{e};
    CHECK(e->cgroup_warning().empty());
    int64_t gc = sdtest::read_pid_file(gc_file);
    REQUIRE(gc > 0);
    REQUIRE(log_contains(log, "forked grandchild"));
    // Out of the engine's session and group (once the child has run its setsid()): a session
    // scan cannot find it.
    REQUIRE(sdtest::wait_for([&] {
      auto g = read_proc_stat(gc);
      return g && g->sid == gc;
    }, 5000));
    auto gst = read_proc_stat(gc);
    REQUIRE(gst);
    CHECK(gst->pgid == gc);
    if (with_cgroup) {
      // In the launch cgroup from its first instruction on, and so is what it forked.
      const std::string rel = own_cgroup_line(e->pid());
      CHECK(rel.find(launch_cgroup_name(tag)) != std::string::npos);
      CHECK(own_cgroup_line(gc) == rel);
      CHECK(e->identity().cgroup);
    } else {
      CHECK(has_launch_marker(gc, tag));
    }
    auto members = e->members();
    CHECK(members.size() == 2);
    auto r = terminate(*e, 300ms, 3s);
    CHECK(r.clean());
    CHECK(r.sigkill_sent);
    CHECK_FALSE(sdtest::alive(e->pid()));
    CHECK_FALSE(sdtest::alive(gc));
    if (cg) CHECK_FALSE(std::filesystem::exists(cg->path()));  // removed once empty
    ::close(fd);
    std::filesystem::remove_all(dir);
  }
}

TEST_CASE("identity: a process that only carries a dead leader's session id is not signalled") {
  // An unrelated session: sh leads it, starts `sleep` (same session and group) and exits. The
  // session id is now a dead pid, exactly what a recorded engine pid looks like after reuse.
  auto dir = sdtest::temp_dir("id");
  const std::string pid_file = dir + "/sleep.pid";
  const std::string script = "sleep 30 & echo $! > " + pid_file + ".tmp && mv " + pid_file + ".tmp " + pid_file;
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSID);
  const char* argv[] = {"/bin/sh", "-c", script.c_str(), nullptr};
  pid_t sh = 0;
  REQUIRE(posix_spawn(&sh, "/bin/sh", nullptr, &attr, const_cast<char* const*>(argv), environ) == 0);
  posix_spawnattr_destroy(&attr);
  int64_t sleeper = sdtest::read_pid_file(pid_file);
  int st = 0;
  ::waitpid(sh, &st, 0);
  REQUIRE(sleeper > 0);
  auto s = read_proc_stat(sleeper);
  REQUIRE(s);
  REQUIRE(s->sid == sh);
  REQUIRE_FALSE(sdtest::alive(sh));

  EngineIdentity id{sh, 12345, launch_tag(dir, 1), nullptr};
  CHECK(launch_members(id, /*leader_alive=*/false).empty());
  auto r = terminate_orphans(id, 200ms, 200ms);
  CHECK(r.pids_seen.empty());
  CHECK(sdtest::alive(sleeper));  // today's pgid/sid kill would have killed it

  // Only a process verifiably ours is signalled: a pidfd with the wrong start time refuses.
  CHECK_FALSE(Pidfd::open_verified(sleeper, s->start_time + 1).valid());
  CHECK_FALSE(signal_verified(ProcStat{sleeper, "sleep", 'S', 0, 0, 0, s->start_time + 1}, SIGKILL));
  CHECK(sdtest::alive(sleeper));
  CHECK(signal_verified(*s, SIGKILL));
  CHECK(sdtest::wait_for([&] { return !sdtest::alive(sleeper); }, 3000));
  std::filesystem::remove_all(dir);
}

TEST_CASE("identity: an exit by signal is named, not 128 + N") {
  CHECK(describe_wait_status(9) == "killed by signal 9 (SIGKILL)");      // W_EXITCODE(0, SIGKILL)
  CHECK(describe_wait_status(7 << 8) == "exited with status 7");
  CHECK(describe_wait_status(15) == "killed by signal 15 (SIGTERM)");
  auto dir = sdtest::temp_dir("id");
  int fd = ::open((dir + "/engine.log").c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  auto e = EngineProcess::spawn({sdtest::fake_engine(), {sdtest::fake_engine(), "--port", "0"}, {}, fd, "", nullptr});
  sdtest::KillOnExit guard{e};
  ::kill(static_cast<pid_t>(e->pid()), SIGKILL);
  REQUIRE(e->wait_exit(3s));
  CHECK(e->exit_description() == "killed by signal 9 (SIGKILL)");
  CHECK(e->exit_status() == 137);  // what the state store's exit_status column keeps
  ::close(fd);
  std::filesystem::remove_all(dir);
}

TEST_CASE("holders: the process listening on a port is named with its command line") {
  int s = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(s >= 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  REQUIRE(::listen(s, 4) == 0);
  socklen_t len = sizeof a;
  REQUIRE(::getsockname(s, reinterpret_cast<sockaddr*>(&a), &len) == 0);
  const int port = ntohs(a.sin_port);
  auto holders = tcp_port_holders(port);
  REQUIRE(holders.size() == 1);
  CHECK(holders[0].pid == getpid());
  CHECK(holders[0].command.find("test_gateway_supervisor") != std::string::npos);
  std::string d = describe_port_holders(port);
  CHECK(d.find("port " + std::to_string(port) + " is held by pid " + std::to_string(getpid())) == 0);
  ::close(s);
  CHECK(describe_port_holders(port).empty());
}
