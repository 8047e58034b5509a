// The `servedeck serve` daemon under failures and load, through its real HTTP interface: a state
// store error during a switch fails that switch and nothing else; status answers while switches
// queue behind a slow load; a request for a model being drained gets 503 model_draining.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <signal.h>
#include <sqlite3.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "common/http/client.hpp"
#include "gateway/supervisor/launch_log.hpp"
#include "gateway/supervisor/process_group.hpp"
#include "tests/gateway/cli/cli_run.hpp"
#include "tests/gateway/supervisor/test_util.hpp"

using namespace servedeck;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

namespace {

using sdtest::cli_cmd;
using sdtest::contains;
using sdtest::Run;

Run run_cli(const std::string& args) { return cli_cmd(std::string(SERVEDECK_CLI) + " " + args + " 2>&1"); }

/// Joins its threads when the test leaves its scope, also through a failed REQUIRE.
struct Joined {
  std::vector<std::thread> threads;
  ~Joined() {
    for (auto& t : threads)
      if (t.joinable()) t.join();
  }
};

/// The admin token the daemon with state directory `state` wrote ("" before it did).
std::string admin_token(const std::string& state) {
  std::string t;
  std::ifstream(state + "/admin.token") >> t;
  return t;
}

/// /admin/status as JSON (null when the daemon does not answer in time).
nlohmann::json status_of(int port, const std::string& state, int timeout_ms = 2000) {
  try {
    http::ClientRequest r;
    r.port = port;
    r.target = "/admin/status";
    r.headers = {{"Authorization", "Bearer " + admin_token(state)}};
    r.timeout_ms = timeout_ms;
    return nlohmann::json::parse(http::fetch(r).body, nullptr, false);
  } catch (const std::exception&) {
    return nullptr;
  }
}

/// A daemon on a temp state dir with models `a` (a 20-chunk, 1 s stream), `b`, and `slow` (3 s load).
struct Daemon {
  std::string dir = sdtest::temp_dir("daemon");
  std::string cfg = dir + "/models.toml";
  std::string state = dir + "/state";
  int log_fd = -1;
  int port = 0;
  std::shared_ptr<supervisor::EngineProcess> proc;
  std::unique_ptr<sdtest::KillOnExit> guard;

  Daemon() {
    const std::string fe = SERVEDECK_FAKE_ENGINE;
    std::ofstream f(cfg);
    f << "[server]\nlisten = \"127.0.0.1:0\"\nstate_dir = \"" << state << "\"\n\n";
    auto model = [&](const std::string& name, const std::string& extra) {
      f << "[models." << name << "]\nengine = \"command\"\nserved_name = \"" << name << "-served\"\nprogram = \""
        << fe << "\"\nargs = [\"--port\", \"{port}\", \"--served-name\", \"{served_name}\"" << extra << "]\n"
        << "ctx = 4096\nstart_timeout_s = 20\nstop_timeout_s = 2\ndrain_timeout_s = 10\n\n";
    };
    model("a", ", \"--chunks\", \"20\", \"--stream-delay-ms\", \"100\"");
    model("b", "");
    model("slow", ", \"--slow-start-ms\", \"3000\"");
    f.close();
    fs::create_directories(state);
    log_fd = ::open((dir + "/daemon.log").c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    proc = supervisor::EngineProcess::spawn({SERVEDECK_CLI, {SERVEDECK_CLI, "--config", cfg, "serve"}, {}, log_fd});
    guard.reset(new sdtest::KillOnExit{proc});
    REQUIRE_MESSAGE(sdtest::wait_for([&] { return fs::exists(state + "/daemon.json"); }, 15000), log());
    port = nlohmann::json::parse(std::ifstream(state + "/daemon.json"))["port"];
  }
  ~Daemon() {
    guard.reset();
    if (log_fd >= 0) ::close(log_fd);
    fs::remove_all(dir);
  }
  std::string log() const { return supervisor::tail_lines(dir + "/daemon.log", 60); }
  std::string flags() const { return "--config " + cfg + " "; }
  http::ClientResponse get(const std::string& target, int timeout_ms = 5000) const {
    http::ClientRequest r;
    r.port = port;
    r.target = target;
    r.timeout_ms = timeout_ms;
    return http::fetch(r);
  }
  http::ClientResponse post(const std::string& target, const std::string& body, int timeout_ms = 20000) const {
    http::ClientRequest r;
    r.port = port;
    r.method = "POST";
    r.target = target;
    r.body = body;
    r.timeout_ms = timeout_ms;
    if (target.rfind("/admin/", 0) == 0) r.headers = {{"Authorization", "Bearer " + admin_token(state)}};
    return http::fetch(r);
  }
  void sql(const std::string& statement) const {
    sqlite3* db = nullptr;
    REQUIRE(sqlite3_open((state + "/state.db").c_str(), &db) == SQLITE_OK);
    sqlite3_busy_timeout(db, 5000);
    char* err = nullptr;
    int rc = sqlite3_exec(db, statement.c_str(), nullptr, nullptr, &err);
    std::string msg = err ? err : "";
    sqlite3_free(err);
    sqlite3_close(db);
    REQUIRE_MESSAGE(rc == SQLITE_OK, msg);
  }
};

}  // namespace

TEST_CASE("daemon: a state store error during a switch fails that switch; the daemon keeps serving") {
  Daemon d;
  d.sql("CREATE TRIGGER sd_fail BEFORE INSERT ON launches "
        "BEGIN SELECT RAISE(ABORT, 'disk I/O error (injected)'); END;");
  auto sw = run_cli(d.flags() + "switch b");
  CAPTURE(sw.out);
  CAPTURE(d.log());
  CHECK(sw.rc == 1);
  CHECK(contains(sw.out, "disk I/O error (injected)"));
  CHECK(d.proc->running());
  auto st = run_cli(d.flags() + "status --json");
  CAPTURE(st.out);
  REQUIRE(st.rc == 0);  // the daemon answers
  auto sj = nlohmann::json::parse(st.out);
  CHECK(sj["state"] == "failed");
  CHECK(sj["last_error"].get<std::string>().find("disk I/O error (injected)") != std::string::npos);
  CHECK(d.get("/health").status == 200);

  d.sql("DROP TRIGGER sd_fail;");
  auto ok = run_cli(d.flags() + "switch b");
  CAPTURE(ok.out);
  CHECK(ok.rc == 0);
  auto r = d.post("/v1/chat/completions", R"({"model":"b-served","messages":[{"role":"user","content":"hi"}]})");
  CHECK(r.status == 200);
}

TEST_CASE("daemon: status answers at once while switches queue behind a slow load") {
  Daemon d;
  // More waiting switches than the daemon's blocking pool has threads: they wait on the switch
  // queue, not in the pool that status shares.
  std::atomic<int> finished{0};
  Joined callers;
  for (int i = 0; i < 6; ++i)
    callers.threads.emplace_back([&] {
      try {
        auto r = d.post("/admin/switch", R"({"model":"slow"})", 30000);
        if (r.status == 200 && contains(r.body, "\"ok\":true")) ++finished;
      } catch (const std::exception&) {
      }
    });
  // Six switches are waiting now; the load takes 3 s.
  REQUIRE(sdtest::wait_for([&] {
    auto s = status_of(d.port, d.state);
    return s.is_object() && s["state"] == "starting";
  }, 10000));
  for (int i = 0; i < 3; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    auto s = status_of(d.port, d.state, 1500);
    CHECK(std::chrono::steady_clock::now() - t0 < 1000ms);
    CHECK(s.is_object());
    if (s.is_object()) CHECK(s["state"] == "starting");
  }
  for (auto& t : callers.threads) t.join();
  CHECK(finished == 6);  // one load, six callers told it is ready
  auto launches = nlohmann::json::parse(run_cli(d.flags() + "status --json").out);
  CHECK(launches["state"] == "ready");
  CHECK(launches["model"] == "slow");
}

TEST_CASE("daemon: a request for the model a switch is draining gets 503 model_draining naming the target") {
  Daemon d;
  REQUIRE(run_cli(d.flags() + "switch a").rc == 0);
  std::atomic<bool> started{false};
  Joined threads;
  threads.threads.emplace_back([&] {
    http::ClientRequest r;
    r.port = d.port;
    r.method = "POST";
    r.target = "/v1/chat/completions";
    r.body = R"({"model":"a-served","stream":true,"messages":[{"role":"user","content":"hi"}]})";
    r.timeout_ms = 20000;
    try {
      http::fetch_stream(r, [](int, const std::map<std::string, std::string>&) {}, [&](std::string_view) {
        started = true;
        return true;
      });
    } catch (const std::exception&) {
    }
  });
  REQUIRE(sdtest::wait_for([&] { return started.load(); }, 10000));
  threads.threads.emplace_back([&] { run_cli(d.flags() + "switch b"); });
  // From the moment the switch drains a, requests for a are refused: the first refusal a client
  // sees must say "draining" and name b, not "not running".
  http::ClientResponse r;
  REQUIRE(sdtest::wait_for([&] {
    r = d.post("/v1/chat/completions", R"({"model":"a-served","messages":[{"role":"user","content":"hi"}]})");
    return r.status != 200;
  }, 10000));
  CAPTURE(r.body);
  CHECK(r.status == 503);
  CHECK(r.headers["retry-after"] == "30");
  auto body = nlohmann::json::parse(r.body, nullptr, false);
  REQUIRE(body.is_object());
  CHECK(body["error"]["code"] == "model_draining");
  CHECK(body["error"]["message"].get<std::string>().find("switching to 'b'") != std::string::npos);
}

TEST_CASE("daemon: an engine killed by a signal is reported by that signal, not as status 137") {
  Daemon d;
  REQUIRE(run_cli(d.flags() + "switch b").rc == 0);
  auto sj = nlohmann::json::parse(run_cli(d.flags() + "status --json").out);
  const int64_t pid = sj["pid"];
  REQUIRE(pid > 0);
  ::kill(static_cast<pid_t>(pid), SIGKILL);
  REQUIRE(sdtest::wait_for([&] {
    auto s = status_of(d.port, d.state);
    return s.is_object() && s["state"] == "failed";
  }, 10000));
  auto human = run_cli(d.flags() + "status");
  CAPTURE(human.out);
  CHECK(contains(human.out, "last launch: pid " + std::to_string(pid)));
  CHECK(contains(human.out, "killed by signal 9 (SIGKILL)"));
  CHECK_FALSE(contains(human.out, "137"));
  auto j = nlohmann::json::parse(run_cli(d.flags() + "status --json").out);
  CHECK(j["exit_reason"] == "killed by signal 9 (SIGKILL)");
  CHECK(j["last_error"].get<std::string>().find("was killed by signal 9 (SIGKILL) after ready") != std::string::npos);
}
