#include <doctest/doctest.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "common/http/client.hpp"
#include "gateway/state/store.hpp"
#include "gateway/supervisor/launch_log.hpp"
#include "gateway/supervisor/process_group.hpp"
#include "tests/gateway/supervisor/test_util.hpp"

using namespace servedeck;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

namespace {

struct Run {
  int rc = -1;
  std::string out;
};

/// Runs the servedeck CLI with `args` (shell-quoted by the caller), stdout+stderr captured.
Run cli(const std::string& args) {
  std::string cmd = std::string(SERVEDECK_CLI) + " " + args + " 2>&1";
  Run r;
  FILE* p = popen(cmd.c_str(), "r");
  REQUIRE(p);
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  int st = pclose(p);
  r.rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

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
  auto r = cli("--state-dir " + dir + " status");
  CAPTURE(r.out);
  CHECK(r.rc == 3);
  CHECK(r.out.find("DOWN") != std::string::npos);
  CHECK(r.out.find("glm53") != std::string::npos);
  CHECK(r.out.find("state failed") != std::string::npos);
  CHECK(r.out.find("engine exited during start with status 1") != std::string::npos);
  CHECK(r.out.find("(gone)") != std::string::npos);

  // A stale daemon.json (daemon crashed) still ends in the store fallback.
  std::ofstream(dir + "/daemon.json") << R"({"host":"127.0.0.1","port":1,"pid":1})";
  auto j = cli("--state-dir " + dir + " status --json");
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
  auto r = cli("frobnicate");
  CHECK(r.rc == 2);
  CHECK(r.out.find("unknown verb 'frobnicate'") != std::string::npos);
  auto dir = sdtest::temp_dir("cli");
  auto cfg = write_config(dir);
  auto ok = cli("--config " + cfg + " lint");
  CAPTURE(ok.out);
  CHECK(ok.rc == 0);
  int lines = 0;
  {
    std::ifstream in(cfg);
    for (std::string l; std::getline(in, l);) ++lines;
  }
  std::ofstream(cfg, std::ios::app) << "stop_timeot_s = 3\n";  // typo'd key in [models.b]
  auto bad = cli("--config " + cfg + " lint");
  CAPTURE(bad.out);
  CHECK(bad.rc == 1);
  CHECK(bad.out.find("stop_timeot_s") != std::string::npos);
  CHECK(bad.out.find("models.toml:" + std::to_string(lines + 1) + ":") != std::string::npos);
  fs::remove_all(dir);
}

TEST_CASE("cli: preflight MODEL works without a daemon") {
  auto dir = sdtest::temp_dir("cli");
  auto cfg = write_config(dir);
  auto r = cli("--config " + cfg + " preflight b --json");
  CAPTURE(r.out);
  CHECK(r.rc == 0);
  auto j = nlohmann::json::parse(r.out, nullptr, false);
  REQUIRE_FALSE(j.is_discarded());
  CHECK(j["model"] == "b");
  CHECK(j["refused"] == false);
  CHECK(cli("--config " + cfg + " preflight nope").rc == 2);
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

  auto sw = cli(flags + "switch a");
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
  auto sw2 = cli(flags + "switch b");
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

  auto st = cli(flags + "status --json");
  CAPTURE(st.out);
  REQUIRE(st.rc == 0);
  auto sj = nlohmann::json::parse(st.out, nullptr, false);
  REQUIRE_FALSE(sj.is_discarded());
  CHECK(sj["state"] == "ready");
  CHECK(sj["model"] == "b");
  CHECK(sj["daemon"]["up"] == true);
  int64_t engine_pid = sj["pid"];
  CHECK(sdtest::alive(engine_pid));
  auto human = cli(flags + "status");
  CHECK(human.out.find("slot main: ready  model b") != std::string::npos);

  auto logs = cli(flags + "logs --lines 20");
  CAPTURE(logs.out);
  CHECK(logs.rc == 0);
  CHECK(logs.out.find("listening on") != std::string::npos);
  auto models = cli(flags + "models");
  CHECK(models.out.find("a-served") != std::string::npos);
  CHECK(models.out.find("ready") != std::string::npos);

  // SIGTERM: the daemon stops serving, stops the engine, removes daemon.json, exits 0.
  ::kill(static_cast<pid_t>(daemon->pid()), SIGTERM);
  REQUIRE_MESSAGE(daemon->wait_exit(15s), daemon_log());
  CHECK(daemon->exit_status() == 0);
  CHECK_FALSE(sdtest::alive(engine_pid));
  CHECK_FALSE(fs::exists(state + "/daemon.json"));
  auto down = cli(flags + "status");
  CAPTURE(down.out);
  CHECK(down.rc == 3);
  CHECK(down.out.find("state stopped") != std::string::npos);
  CHECK(down.out.find("daemon shutdown") != std::string::npos);
  ::close(log_fd);
  fs::remove_all(dir);
}
