// `servedeck switch` refused by preflight and `servedeck status` of a failed slot, end to end:
// the daemon with fake engines, driven through the CLI.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>

#include <nlohmann/json.hpp>

#include "common/http/client.hpp"
#include "gateway/supervisor/launch_log.hpp"
#include "gateway/supervisor/process_group.hpp"
#include "tests/gateway/cli/cli_run.hpp"
#include "tests/gateway/supervisor/test_util.hpp"

using namespace servedeck;
namespace fs = std::filesystem;

namespace {

using sdtest::contains;
using sdtest::Run;

Run servedeck_cli(const std::string& args) { return sdtest::cli_cmd(std::string(SERVEDECK_CLI) + " " + args + " 2>&1"); }

}  // namespace

TEST_CASE("cli status: a refused switch keeps the running model; a failed slot shows its last launch, not live readings") {
  auto dir = sdtest::temp_dir("clistatus");
  std::string state = dir + "/state";
  fs::create_directories(state);
  std::string cfg = dir + "/models.toml";
  {
    std::string fe = SERVEDECK_FAKE_ENGINE;
    std::ofstream f(cfg);
    f << "[server]\nlisten = \"127.0.0.1:0\"\nstate_dir = \"" << state << "\"\n";
    auto model = [&](const std::string& name, const std::string& program, const std::string& extra) {
      f << "\n[models." << name << "]\nengine = \"command\"\nserved_name = \"" << name << "-served\"\nprogram = \""
        << program << "\"\nargs = [\"--port\", \"{port}\", \"--served-name\", \"{served_name}\"" << extra
        << "]\nctx = 4096\nstart_timeout_s = 10\nstop_timeout_s = 2\nwarmup = false\n";
    };
    model("a", fe, "");
    model("flaky", fe, ", \"--exit-after-ready-ms\", \"300\"");
    model("ghost", dir + "/no-such-engine", "");
  }
  int log_fd = ::open((dir + "/daemon.log").c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  auto daemon = supervisor::EngineProcess::spawn({SERVEDECK_CLI, {SERVEDECK_CLI, "--config", cfg, "serve"}, {}, log_fd});
  sdtest::KillOnExit guard{daemon};
  auto daemon_log = [&] { return supervisor::tail_lines(dir + "/daemon.log", 50); };
  REQUIRE_MESSAGE(sdtest::wait_for([&] { return fs::exists(state + "/daemon.json"); }, 15000), daemon_log());
  int gw_port = nlohmann::json::parse(std::ifstream(state + "/daemon.json"))["port"];
  const std::string flags = "--config " + cfg + " ";

  auto a = servedeck_cli(flags + "switch a");
  REQUIRE_MESSAGE(a.rc == 0, a.out);

  // 1. A missing program refuses before a is stopped: a stays ready with the same pid.
  auto before = nlohmann::json::parse(servedeck_cli(flags + "status --json").out);
  auto ghost = servedeck_cli(flags + "switch ghost");
  CAPTURE(ghost.out);
  CHECK(ghost.rc == 1);
  CHECK(contains(ghost.out, "preflight refused ghost before stopping a"));
  CHECK(contains(ghost.out, "no-such-engine is missing or not executable"));
  CHECK_FALSE(contains(ghost.out, "stopping a (pid"));
  auto after = nlohmann::json::parse(servedeck_cli(flags + "status --json").out);
  CHECK(after["state"] == "ready");
  CHECK(after["model"] == "a");
  CHECK(after["pid"] == before["pid"]);
  CHECK(sdtest::alive(after["pid"].get<int64_t>()));
  // The refusal is recorded in status: the model and the refused checks (JSON), one line (text).
  CHECK(before["refused_model"].is_null());
  CHECK(before["refusal"].is_null());
  CHECK(after["refused_model"] == "ghost");
  REQUIRE(after["refusal"].is_string());
  CHECK(contains(after["refusal"].get<std::string>(), "no-such-engine is missing or not executable"));
  auto refused_text = servedeck_cli(flags + "status");
  CAPTURE(refused_text.out);
  CHECK(contains(refused_text.out, "slot main: ready  model a"));
  CHECK(contains(refused_text.out, "  last switch refused: ghost: program: "));
  CHECK(contains(refused_text.out, "no-such-engine is missing or not executable"));

  // 4. A slot whose engine died: status names the last launch and its exit status, no uptime or memory.
  REQUIRE(servedeck_cli(flags + "switch flaky").rc == 0);
  nlohmann::json failed;
  REQUIRE(sdtest::wait_for([&] {
    failed = nlohmann::json::parse(servedeck_cli(flags + "status --json").out);
    return failed["state"] == "failed";
  }, 5000));
  std::string flaky_log = failed["log_path"];
  auto human = servedeck_cli(flags + "status");
  CAPTURE(human.out);
  CHECK(contains(human.out, "slot main: failed"));
  CHECK(contains(human.out, "last launch: pid " + std::to_string(failed["last_pid"].get<int64_t>())));
  CHECK(contains(human.out, "exit status 3"));
  CHECK_FALSE(contains(human.out, "uptime"));
  CHECK_FALSE(contains(human.out, "host RAM"));
  CHECK(contains(human.out, "last error: engine flaky"));
  // flaky came up ready before it died: the earlier refusal of ghost is history.
  CHECK(failed["refused_model"].is_null());
  CHECK_FALSE(contains(human.out, "last switch refused"));

  // 3 and 2. From the failed slot, ghost is refused after the (empty) stop: the slot is failed for
  // ghost, which never launched: no log path, no last launch; flaky's log is not written to.
  std::string flaky_before = supervisor::tail_lines(flaky_log, 200);
  auto ghost2 = servedeck_cli(flags + "switch ghost");
  CHECK(ghost2.rc == 1);
  auto g = servedeck_cli(flags + "status");
  CAPTURE(g.out);
  CHECK(contains(g.out, "slot main: failed  model ghost"));
  CHECK_FALSE(contains(g.out, "  log "));
  CHECK_FALSE(contains(g.out, "last launch"));
  CHECK_FALSE(contains(g.out, "uptime"));
  CHECK(supervisor::tail_lines(flaky_log, 200) == flaky_before);
  http::ClientRequest req;
  req.port = gw_port;
  req.method = "POST";
  req.target = "/v1/chat/completions";
  req.body = R"({"model":"ghost-served","messages":[{"role":"user","content":"hi"}]})";
  auto resp = http::fetch(req);
  CAPTURE(resp.body);
  CHECK(resp.status == 409);
  CHECK(contains(resp.body, "its slot is failed: preflight refused ghost"));
  CHECK(contains(resp.body, "servedeck status"));
  CHECK_FALSE(contains(resp.body, "the running model is"));

  ::kill(static_cast<pid_t>(daemon->pid()), SIGTERM);
  CHECK(daemon->wait_exit(std::chrono::seconds(20)));
  ::close(log_fd);
  fs::remove_all(dir);
}
