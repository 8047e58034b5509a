#include <doctest/doctest.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "common/http/client.hpp"
#include "gateway/cli/cli_common.hpp"
#include "gateway/state/store.hpp"
#include "gateway/supervisor/launch_log.hpp"
#include "gateway/supervisor/process_group.hpp"
#include "tests/gateway/cli/cli_run.hpp"
#include "tests/gateway/supervisor/test_util.hpp"

using namespace servedeck;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

namespace {

using sdtest::cli_cmd;
using sdtest::Run;

/// Runs the servedeck CLI with `args` (shell-quoted by the caller), stdout+stderr captured.
Run run_cli(const std::string& args) { return cli_cmd(std::string(SERVEDECK_CLI) + " " + args + " 2>&1"); }

/// Runs the CLI in `cwd` with $SERVEDECK_STATE_DIR unset (a user's shell outside the repo).
Run cli_in(const std::string& cwd, const std::string& args) {
  return cli_cmd("cd '" + cwd + "' && env -u SERVEDECK_STATE_DIR " + SERVEDECK_CLI + " " + args + " 2>&1");
}

using sdtest::contains;

std::string write_config(const std::string& dir, const std::string& extra_a = "") {
  std::string fe = SERVEDECK_FAKE_ENGINE;
  std::string path = dir + "/models.toml";
  std::ofstream f(path);
  f << "[server]\nlisten = \"127.0.0.1:0\"\nstate_dir = \"" << dir << "/state\"\n\n"
    << "[models.a]\nengine = \"command\"\nserved_name = \"a-served\"\nprogram = \"" << fe << "\"\n"
    << "args = [\"--port\", \"{port}\", \"--served-name\", \"{served_name}\", \"--chunks\", \"20\", "
       "\"--stream-delay-ms\", \"50\"" << extra_a << "]\n"
    << "ctx = 4096\nstart_timeout_s = 10\nstop_timeout_s = 2\ndrain_timeout_s = 10\n\n"
    << "[models.b]\nengine = \"command\"\nserved_name = \"b-served\"\nprogram = \"" << fe << "\"\n"
    << "args = [\"--port\", \"{port}\", \"--served-name\", \"{served_name}\"]\n"
    << "ctx = 2048\nstart_timeout_s = 10\nstop_timeout_s = 2\n";
  return path;
}

}  // namespace

TEST_CASE("cli: status with no daemon reads the state store and says the daemon is down") {
  auto dir = sdtest::temp_dir("cli");
  {
    state::Store store(dir);
    state::LaunchRecord r;
    r.model = "glm53";
    r.state = "failed";
    r.pid = 999999;  // not a live pid
    r.start_ms = state::now_ms() - 5000;
    r.why = "engine exited during start with status 1";
    r.log_path = dir + "/logs/glm53-1.log";
    store.begin_launch(r);
  }
  auto r = run_cli("--state-dir " + dir + " status");
  CAPTURE(r.out);
  CHECK(r.rc == 3);
  CHECK(r.out.find("DOWN") != std::string::npos);
  CHECK(r.out.find("glm53") != std::string::npos);
  CHECK(r.out.find("state failed") != std::string::npos);
  CHECK(r.out.find("engine exited during start with status 1") != std::string::npos);
  CHECK(r.out.find("(gone)") != std::string::npos);

  // A stale daemon.json (daemon crashed) still ends in the store fallback.
  std::ofstream(dir + "/daemon.json") << R"({"host":"127.0.0.1","port":1,"pid":1})";
  auto j = run_cli("--state-dir " + dir + " status --json");
  CAPTURE(j.out);
  CHECK(j.rc == 3);
  auto parsed = nlohmann::json::parse(j.out, nullptr, false);
  REQUIRE_FALSE(parsed.is_discarded());
  CHECK(parsed["daemon"]["up"] == false);
  CHECK(parsed["daemon"]["why"].get<std::string>().find("no answer at 127.0.0.1:1") != std::string::npos);
  CHECK(parsed["last_launch"]["model"] == "glm53");
  CHECK(parsed["last_launch"]["pid_alive"] == false);
  fs::remove_all(dir);
}

TEST_CASE("cli: usage errors and lint") {
  auto r = run_cli("frobnicate");
  CHECK(r.rc == 2);
  CHECK(r.out.find("unknown verb 'frobnicate'") != std::string::npos);
  auto dir = sdtest::temp_dir("cli");
  auto cfg = write_config(dir);
  auto ok = run_cli("--config " + cfg + " lint");
  CAPTURE(ok.out);
  CHECK(ok.rc == 0);
  int lines = 0;
  {
    std::ifstream in(cfg);
    for (std::string l; std::getline(in, l);) ++lines;
  }
  std::ofstream(cfg, std::ios::app) << "stop_timeot_s = 3\n";  // typo'd key in [models.b]
  auto bad = run_cli("--config " + cfg + " lint");
  CAPTURE(bad.out);
  CHECK(bad.rc == 1);
  CHECK(bad.out.find("stop_timeot_s") != std::string::npos);
  CHECK(bad.out.find("models.toml:" + std::to_string(lines + 1) + ":") != std::string::npos);
  fs::remove_all(dir);
}

TEST_CASE("cli: with no models.toml in reach the CLI says so instead of calling the daemon down") {
  if (fs::exists("/etc/servedeck/models.toml") || fs::exists("/var/lib/servedeck/daemon.json")) {
    MESSAGE("skipped: this machine has /etc/servedeck/models.toml or /var/lib/servedeck/daemon.json");
    return;
  }
  auto dir = fs::canonical(sdtest::temp_dir("cli")).string();
  const std::string expected = "no models.toml in " + dir + " or /etc/servedeck; pass --config FILE";
  for (const std::string verb : {"status", "status --json", "switch tiny-chat", "stop", "logs", "models", "lint",
                                 "preflight tiny", "soak", "probe amnesia"}) {
    auto r = cli_in(dir, verb);
    CAPTURE(verb);
    CAPTURE(r.out);
    CHECK(r.rc == 2);
    CHECK(contains(r.out, expected));
    CHECK_FALSE(contains(r.out, "DOWN"));
    CHECK_FALSE(contains(r.out, "not running"));
    CHECK_FALSE(contains(r.out, "start it with"));
  }

  // Told where the state is, the CLI knows, and a missing daemon is DOWN (exit 3) as documented.
  auto known = cli_in(dir, "--state-dir " + dir + " status");
  CAPTURE(known.out);
  CHECK(known.rc == 3);
  CHECK(contains(known.out, "DOWN"));
  auto env = cli_cmd("cd '" + dir + "' && SERVEDECK_STATE_DIR='" + dir + "' " + SERVEDECK_CLI + " status 2>&1");
  CAPTURE(env.out);
  CHECK(env.rc == 3);

  // ./models.toml in the working directory is found: its state_dir is where the CLI looks.
  write_config(dir);
  auto here = cli_in(dir, "status");
  CAPTURE(here.out);
  CHECK(here.rc == 3);
  CHECK(contains(here.out, "DOWN (no " + dir + "/state/daemon.json)"));
  CHECK(cli_in(dir, "lint").rc == 0);

  // A ./models.toml that does not load: the state dir is only a guess again, and the CLI says why.
  std::ofstream(dir + "/models.toml") << "[server\n";
  auto broken = cli_in(dir, "status");
  CAPTURE(broken.out);
  CHECK(broken.rc == 2);
  CHECK(contains(broken.out, "models.toml does not load"));
  CHECK_FALSE(contains(broken.out, "DOWN"));
  fs::remove_all(dir);
}

TEST_CASE("cli: --help documents the config lookup and every exit status") {
  auto r = run_cli("--help");
  CHECK(r.rc == 0);
  CHECK(contains(r.out, "exits 2 (pass --config FILE or --state-dir DIR)"));
  for (const std::string code : {"  0  ", "  1  ", "  2  ", "  3  "}) CHECK(contains(r.out, code));
}

TEST_CASE("cli: lint prints the [[rules]] verdict line, clean or not") {
  auto dir = sdtest::temp_dir("cli");
  auto cfg = write_config(dir);
  std::ofstream(cfg, std::ios::app) << "\n[[rules]]\nid = \"no-vllm\"\naction = \"refuse\"\n"
                                    << "reason = \"test: vllm is not installed here\"\n[rules.match]\nengine = \"vllm\"\n";
  auto clean = run_cli("--config " + cfg + " lint");
  CAPTURE(clean.out);
  CHECK(clean.rc == 0);
  CHECK(contains(clean.out, "1 rule evaluated against 2 models, none match\n"));
  CHECK(contains(clean.out, cfg + ": no problems\n"));

  std::ofstream(cfg, std::ios::app) << "\n[[rules]]\nid = \"command-warn\"\naction = \"warn\"\n"
                                    << "reason = \"test: command engines are unchecked\"\n[rules.match]\nengine = \"command\"\n";
  auto hits = run_cli("--config " + cfg + " lint");
  CAPTURE(hits.out);
  CHECK(hits.rc == 0);  // warnings only
  CHECK(contains(hits.out, "models.a: rule command-warn (warn"));
  CHECK(contains(hits.out, "models.b: rule command-warn (warn"));
  CHECK(contains(hits.out, "2 rules evaluated against 2 models, 2 matches (above)\n"));
  CHECK(contains(hits.out, "0 error(s), 2 warning(s)"));
  fs::remove_all(dir);
}

TEST_CASE("cli: models sizes its columns to the longest entry") {
  nlohmann::json models = nlohmann::json::array();
  models.push_back({{"name", "tiny"}, {"engine", "native"}, {"ctx", 4096}, {"state", "ready"}, {"ids", {"tiny", "tiny-high"}}});
  models.push_back({{"name", "qwen3-30b-synthetic"}, {"engine", "native"}, {"ctx", 262144}, {"state", "stopped"},
                    {"ids", {"qwen3-30b"}}});
  models.push_back({{"name", "glm53"}, {"engine", "vllm"}, {"ctx", 327680}, {"state", "unknown (daemon down)"},
                    {"ids", {"glm53-flash"}}});
  std::string table = servedeck::cli::models_table(models);
  CAPTURE(table);
  const std::vector<std::string> lines = sdtest::lines_of(table);
  REQUIRE(lines.size() == 3);
  // Every column starts at the same offset on every line.
  auto col = [&](const std::string& line, const std::string& cell) { return line.find(cell); };
  CHECK(col(lines[0], "native") == col(lines[1], "native"));
  CHECK(col(lines[0], "native") == col(lines[2], "vllm"));
  CHECK(col(lines[0], "ctx ") == col(lines[1], "ctx "));
  CHECK(col(lines[0], "ctx ") == col(lines[2], "ctx "));
  CHECK(col(lines[0], "ready") == col(lines[1], "stopped"));
  CHECK(col(lines[0], "ready") == col(lines[2], "unknown (daemon down)"));
  CHECK(col(lines[0], "tiny, tiny-high") == lines[1].rfind("qwen3-30b"));  // the ids, not the name
  CHECK(col(lines[0], "tiny, tiny-high") == col(lines[2], "glm53-flash"));
  CHECK(lines[1].rfind("qwen3-30b-synthetic  native", 0) == 0);  // the longest name sets the width
  for (const auto& l : lines) CHECK(l.back() != ' ');

  // Through the CLI (daemon down: the registry's entries), a long name keeps the columns aligned.
  auto dir = sdtest::temp_dir("cli");
  auto cfg = write_config(dir);
  std::ofstream(cfg, std::ios::app) << "\n[models.qwen3-30b-synthetic]\nengine = \"command\"\nprogram = \"/bin/true\"\n"
                                    << "args = []\nctx = 262144\n";
  auto r = run_cli("--config " + cfg + " models");
  CAPTURE(r.out);
  REQUIRE(r.rc == 0);
  const std::vector<std::string> out = sdtest::lines_of(r.out);
  REQUIRE(out.size() == 3);
  for (const auto& l : out) {
    CHECK(l.find(" ctx ") == out[0].find(" ctx "));
    CHECK(l.find("unknown (daemon down)") == out[0].find("unknown (daemon down)"));
  }
  fs::remove_all(dir);
}

TEST_CASE("cli: preflight MODEL works without a daemon") {
  auto dir = sdtest::temp_dir("cli");
  auto cfg = write_config(dir);
  auto r = run_cli("--config " + cfg + " preflight b --json");
  CAPTURE(r.out);
  CHECK(r.rc == 0);
  auto j = nlohmann::json::parse(r.out, nullptr, false);
  REQUIRE_FALSE(j.is_discarded());
  CHECK(j["model"] == "b");
  CHECK(j["refused"] == false);
  CHECK(run_cli("--config " + cfg + " preflight nope").rc == 2);
  fs::remove_all(dir);
}

TEST_CASE("cli: serve, switch A -> B with a stream in flight through the gateway, status, logs, SIGTERM") {
  auto dir = sdtest::temp_dir("cli");
  auto cfg = write_config(dir);
  std::string state = dir + "/state";
  fs::create_directories(state);
  int log_fd = ::open((dir + "/daemon.log").c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  auto daemon = supervisor::EngineProcess::spawn(
      {SERVEDECK_CLI, {SERVEDECK_CLI, "--config", cfg, "serve"}, {}, log_fd});
  sdtest::KillOnExit guard{daemon};  // SIGTERM first: the daemon stops its engine
  auto daemon_log = [&] { return supervisor::tail_lines(dir + "/daemon.log", 50); };
  REQUIRE_MESSAGE(sdtest::wait_for([&] { return fs::exists(state + "/daemon.json"); }, 15000), daemon_log());
  auto info = nlohmann::json::parse(std::ifstream(state + "/daemon.json"));
  int port = info["port"];
  CHECK(info["pid"] == daemon->pid());
  const std::string flags = "--config " + cfg + " ";

  auto sw = run_cli(flags + "switch a");
  CAPTURE(sw.out);
  REQUIRE(sw.rc == 0);
  CHECK(sw.out.find("preflight: ") != std::string::npos);
  CHECK(sw.out.find("starting a: pid") != std::string::npos);
  CHECK(sw.out.find("ready in") != std::string::npos);

  // A stream through the gateway, then a switch while it is in flight.
  int status = 0;
  std::map<std::string, std::string> headers;
  std::string body;
  std::atomic<bool> started{false};
  std::thread client([&] {
    http::ClientRequest r;
    r.port = port;
    r.method = "POST";
    r.target = "/v1/chat/completions";
    r.body = R"({"model":"a-served","stream":true,"messages":[{"role":"user","content":"hi"}]})";
    r.timeout_ms = 20000;
    try {
      http::fetch_stream(r, [&](int st, const std::map<std::string, std::string>& h) {
        status = st;
        headers = h;
      }, [&](std::string_view c) {
        body += c;
        started = true;
        return true;
      });
    } catch (const std::exception& e) {
      body += std::string("CLIENT ERROR: ") + e.what();
    }
  });
  REQUIRE(sdtest::wait_for([&] { return started.load(); }, 10000));
  auto sw2 = run_cli(flags + "switch b");
  client.join();
  CAPTURE(sw2.out);
  CAPTURE(body);
  CHECK(sw2.rc == 0);
  // The stream completes, or ends with a JSON 503 + Retry-After; never an empty 4xx.
  if (status == 200) {
    CHECK(body.find("data: [DONE]") != std::string::npos);
    CHECK(sw2.out.find("draining 1 in-flight request(s)") != std::string::npos);
  } else {
    CHECK(status == 503);
    CHECK(headers.count("retry-after") == 1);
    auto err = nlohmann::json::parse(body, nullptr, false);
    CHECK_FALSE(err.is_discarded());
    CHECK(err.contains("error"));
  }
  bool client_error = status >= 400 && status < 500;
  CHECK_FALSE(client_error);

  auto st = run_cli(flags + "status --json");
  CAPTURE(st.out);
  REQUIRE(st.rc == 0);
  auto sj = nlohmann::json::parse(st.out, nullptr, false);
  REQUIRE_FALSE(sj.is_discarded());
  CHECK(sj["state"] == "ready");
  CHECK(sj["model"] == "b");
  CHECK(sj["daemon"]["up"] == true);
  int64_t engine_pid = sj["pid"];
  CHECK(sdtest::alive(engine_pid));
  auto human = run_cli(flags + "status");
  CHECK(human.out.find("slot main: ready  model b") != std::string::npos);

  auto logs = run_cli(flags + "logs --lines 20");
  CAPTURE(logs.out);
  CHECK(logs.rc == 0);
  CHECK(logs.out.find("listening on") != std::string::npos);
  auto models = run_cli(flags + "models");
  CHECK(models.out.find("a-served") != std::string::npos);
  CHECK(models.out.find("ready") != std::string::npos);

  // SIGTERM: the daemon stops serving, stops the engine, removes daemon.json, exits 0.
  ::kill(static_cast<pid_t>(daemon->pid()), SIGTERM);
  REQUIRE_MESSAGE(daemon->wait_exit(15s), daemon_log());
  CHECK(daemon->exit_status() == 0);
  CHECK_FALSE(sdtest::alive(engine_pid));
  CHECK_FALSE(fs::exists(state + "/daemon.json"));
  auto down = run_cli(flags + "status");
  CAPTURE(down.out);
  CHECK(down.rc == 3);
  CHECK(down.out.find("state stopped") != std::string::npos);
  CHECK(down.out.find("daemon shutdown") != std::string::npos);
  ::close(log_fd);
  fs::remove_all(dir);
}
