// The control plane apart from the data plane, and stored data with a lifetime, against a real
// `servedeck serve` process: the CLI with server.api_keys set, the admin token, Host / Origin /
// Content-Type checks on both planes, refusal before the body is read, file modes, retention at
// start, /v1/responses store:false, and the one state-directory rule shared with the CLI and the
// systemd unit.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <utility>  // before Boost.Asio: boost 1.74 awaitable.hpp needs std::exchange
#include <boost/asio.hpp>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/http/client.hpp"
#include "gateway/state/store.hpp"
#include "gateway/supervisor/launch_log.hpp"
#include "gateway/supervisor/process_group.hpp"
#include "tests/gateway/cli/cli_run.hpp"
#include "tests/gateway/supervisor/test_util.hpp"

using namespace servedeck;
using namespace std::chrono_literals;
namespace fs = std::filesystem;
using nlohmann::json;
using sdtest::contains;

namespace {

/// A config with one fake-engine model `a` and the given extra [server] lines.
std::string write_config(const std::string& dir, const std::string& server_extra) {
  std::string path = dir + "/models.toml";
  std::ofstream f(path);
  f << "[server]\nlisten = \"127.0.0.1:0\"\nstate_dir = \"" << dir << "/state\"\n" << server_extra << "\n"
    << "[models.a]\nengine = \"command\"\nserved_name = \"a-served\"\nprogram = \"" << SERVEDECK_FAKE_ENGINE << "\"\n"
    << "args = [\"--port\", \"{port}\", \"--served-name\", \"{served_name}\"]\n"
    << "ctx = 4096\nstart_timeout_s = 10\nstop_timeout_s = 2\n";
  return path;
}

unsigned mode_of(const std::string& path) {
  struct stat st {};
  REQUIRE_MESSAGE(::stat(path.c_str(), &st) == 0, path);
  return st.st_mode & 07777u;
}

/// A `servedeck serve` child with its log in <dir>/daemon.log; SIGTERM (then SIGKILL) on scope exit.
struct Daemon {
  std::string dir, config, state;
  int log_fd = -1;
  std::shared_ptr<supervisor::EngineProcess> proc;
  sdtest::KillOnExit guard;
  int port = 0;

  Daemon(std::string d, std::string cfg, std::string state_dir, std::map<std::string, std::string> env = {})
      : dir(std::move(d)), config(std::move(cfg)), state(std::move(state_dir)) {
    log_fd = ::open((dir + "/daemon.log").c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    proc = supervisor::EngineProcess::spawn({SERVEDECK_CLI, {SERVEDECK_CLI, "--config", config, "serve"}, env, log_fd});
    guard.engine = proc;
  }
  ~Daemon() {
    if (log_fd >= 0) ::close(log_fd);
  }
  std::string log() const { return supervisor::tail_lines(dir + "/daemon.log", 60); }
  void wait_listening() {
    REQUIRE_MESSAGE(sdtest::wait_for([&] { return fs::exists(state + "/daemon.json"); }, 15000), log());
    port = json::parse(std::ifstream(state + "/daemon.json"))["port"];
  }
  std::string token() const {
    std::string t;
    std::ifstream(state + "/admin.token") >> t;
    return t;
  }
  http::ClientResponse call(const std::string& method, const std::string& target, http::Headers headers,
                            const std::string& body = "", const std::string& type = "application/json") {
    http::ClientRequest r;
    r.port = port;
    r.method = method;
    r.target = target;
    r.headers = std::move(headers);
    r.body = body;
    r.content_type = type;
    r.timeout_ms = 20000;
    return http::fetch(r);
  }
};

std::string code_of(const http::ClientResponse& r) {
  auto j = json::parse(r.body, nullptr, false);
  return j.is_object() && j.contains("error") ? j["error"].value("code", "") : "";
}

sdtest::Run cli(const std::string& args) { return sdtest::cli_cmd(std::string(SERVEDECK_CLI) + " " + args + " 2>&1"); }

/// The daemons and CLIs these tests start inherit this environment: no state directory from it.
struct CleanEnv {
  CleanEnv() {
    ::unsetenv("SERVEDECK_STATE_DIR");
    ::unsetenv("STATE_DIRECTORY");
  }
};
const CleanEnv clean_env;

}  // namespace

TEST_CASE("daemon: with api_keys set the CLI works; the admin API needs the admin token and nothing else opens it") {
  auto dir = sdtest::temp_dir("cli-access");
  auto cfg = write_config(dir, "api_keys = [\"sk-client\"]");
  Daemon d(dir, cfg, dir + "/state");
  d.wait_listening();
  const std::string flags = "--config " + cfg + " ";

  // Every admin verb of the CLI, with client API keys configured (it used to get 401 on each).
  auto sw = cli(flags + "switch a");
  CAPTURE(sw.out);
  REQUIRE(sw.rc == 0);
  CHECK(contains(sw.out, "ready in"));
  auto st = cli(flags + "status --json");
  CAPTURE(st.out);
  REQUIRE(st.rc == 0);
  auto sj = json::parse(st.out, nullptr, false);
  REQUIRE_FALSE(sj.is_discarded());
  CHECK(sj["state"] == "ready");
  CHECK(cli(flags + "logs --lines 5").rc == 0);
  auto models = cli(flags + "models");
  CHECK(contains(models.out, "ready"));

  const std::string token = d.token();
  REQUIRE(token.size() == 64);
  const http::Headers admin = {{"Authorization", "Bearer " + token}};
  // Without the token, or with a client key, the admin API refuses before doing anything.
  auto anon = d.call("POST", "/admin/stop", {}, "{}");
  CHECK(anon.status == 401);
  CHECK(code_of(anon) == "admin_credential_required");
  CHECK(contains(anon.body, d.state + "/admin.token"));
  auto client_key = d.call("POST", "/admin/stop", {{"Authorization", "Bearer sk-client"}}, "{}");
  CHECK(client_key.status == 401);
  CHECK(code_of(client_key) == "not_an_admin_credential");
  CHECK(d.call("GET", "/admin/logs", {}).status == 401);
  // A browser page: DNS rebinding (its own name in Host), a foreign Origin, a form post.
  auto rebound = d.call("GET", "/admin/logs", {admin[0], {"Host", "rebind.evil.example:" + std::to_string(d.port)}});
  CHECK(rebound.status == 403);
  CHECK(code_of(rebound) == "host_not_allowed");
  auto foreign = d.call("POST", "/admin/stop", {admin[0], {"Origin", "https://evil.example"}}, "{}");
  CHECK(foreign.status == 403);
  CHECK(code_of(foreign) == "origin_not_allowed");
  auto form = d.call("POST", "/admin/stop", admin, "{}", "text/plain");
  CHECK(form.status == 415);
  CHECK(code_of(form) == "unsupported_media_type");
  // None of that stopped the engine.
  auto still = cli(flags + "status --json");
  REQUIRE(still.rc == 0);
  CHECK(json::parse(still.out)["state"] == "ready");

  // The data plane: client keys, not the admin token; Host and Content-Type checked there too.
  const std::string chat = R"({"model":"a-served","messages":[{"role":"user","content":"hi"}]})";
  CHECK(d.call("GET", "/v1/models", admin).status == 401);
  CHECK(d.call("GET", "/v1/models", {{"Authorization", "Bearer sk-client"}}).status == 200);
  CHECK(d.call("GET", "/v1/models", {{"Authorization", "Bearer sk-client"}, {"Host", "rebind.evil.example"}}).status ==
        403);
  CHECK(d.call("POST", "/v1/chat/completions", {{"Authorization", "Bearer sk-client"}}, chat, "text/plain").status ==
        415);
  CHECK(d.call("POST", "/v1/chat/completions", {{"Authorization", "Bearer sk-client"}}, chat).status == 200);

  // A wrong key announcing a 10 MB body that never comes: answered 401 from the head at once
  // (the daemon used to wait for the body until its 30 s header timeout).
  {
    boost::asio::io_context ioc;
    boost::asio::ip::tcp::socket s(ioc);
    s.connect({boost::asio::ip::make_address("127.0.0.1"), static_cast<unsigned short>(d.port)});
    boost::asio::write(s, boost::asio::buffer(std::string(
                              "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer nope\r\n"
                              "Content-Type: application/json\r\nContent-Length: 10000000\r\n\r\n")));
    struct timeval tv{10, 0};
    ::setsockopt(s.native_handle(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    std::string got;
    char buf[4096];
    boost::system::error_code ec;
    while (!ec && !contains(got, "invalid_api_key")) got.append(buf, s.read_some(boost::asio::buffer(buf), ec));
    CAPTURE(got);
    CHECK(got.rfind("HTTP/1.1 401", 0) == 0);
  }

  // Who can read what the daemon keeps.
  CHECK(mode_of(d.state) == 0700);
  CHECK(mode_of(d.state + "/admin.token") == 0640);
  CHECK(mode_of(d.state + "/daemon.json") == 0640);
  for (const char* f : {"/state.db", "/state.db-wal", "/state.db-shm"}) {
    CAPTURE(f);
    CHECK(mode_of(d.state + f) == 0600);
  }

  CHECK(cli(flags + "stop").rc == 0);
  ::kill(static_cast<pid_t>(d.proc->pid()), SIGTERM);
  REQUIRE_MESSAGE(d.proc->wait_exit(15s), d.log());
  CHECK(d.proc->exit_status() == 0);
  CHECK_FALSE(fs::exists(d.state + "/admin.token"));  // a token lives as long as its daemon
  fs::remove_all(dir);
}

TEST_CASE("daemon: retention at start, modes fixed at start, store:false and responses_retention_s") {
  auto dir = sdtest::temp_dir("cli-retention");
  const std::string state = dir + "/state";
  const int64_t day = 24ll * 3600 * 1000;
  {
    // What an older daemon left: an expired stored turn, a 40-day-old request log, loose modes.
    state::Store s(state);
    s.put_document("responses", "resp_expired", {{"messages", json::array()}}, state::now_ms() - 1000);
    s.put_document("responses", "resp_live", {{"messages", json::array()}}, state::now_ms() + day);
    for (int i = 0; i < 4; ++i) {
      state::RequestRecord r;
      r.time_ms = state::now_ms() - 40 * day;
      r.route = "/v1/old";
      s.add_request(r);
    }
  }
  ::chmod(state.c_str(), 0755);
  ::chmod((state + "/state.db").c_str(), 0644);
  auto cfg = write_config(dir, "default_model = \"a\"");  // history_retention_s: 30 days by default
  Daemon d(dir, cfg, state);
  d.wait_listening();
  CHECK(mode_of(state) == 0700);
  CHECK(mode_of(state + "/state.db") == 0600);
  {
    state::Store s(state);
    CHECK_FALSE(s.get_document("responses", "resp_expired"));
    CHECK(s.count_requests("/v1/old") == 0);
    CHECK(s.get_document("responses", "resp_live"));
  }
  CHECK(contains(d.log(), "retention: deleted"));
  REQUIRE_MESSAGE(sdtest::wait_for([&] { return contains(cli("--config " + cfg + " status").out, "ready"); }, 15000),
                  d.log());

  auto respond = [&](const std::string& extra) {
    return d.call("POST", "/v1/responses", {}, R"({"model":"a-served","input":"hi")" + extra + "}");
  };
  auto stored = respond("");
  CAPTURE(stored.body);
  REQUIRE(stored.status == 200);
  const std::string stored_id = json::parse(stored.body)["id"];
  auto unstored = respond(R"(,"store":false)");
  REQUIRE(unstored.status == 200);
  const std::string unstored_id = json::parse(unstored.body)["id"];
  // The turn is written on the blocking pool: wait for it, then ask for both.
  REQUIRE(sdtest::wait_for([&] { return state::Store(state).get_document("responses", stored_id).has_value(); }, 5000));
  CHECK(respond(R"(,"previous_response_id":")" + stored_id + "\"").status == 200);
  auto gone = respond(R"(,"previous_response_id":")" + unstored_id + "\"");
  CHECK(gone.status == 404);
  CHECK(code_of(gone) == "previous_response_not_found");
  CHECK_FALSE(state::Store(state).get_document("responses", unstored_id));
  ::kill(static_cast<pid_t>(d.proc->pid()), SIGTERM);
  REQUIRE_MESSAGE(d.proc->wait_exit(15s), d.log());

  // responses_retention_s = 0: nothing is stored, and what was stored goes at start.
  auto cfg0 = write_config(dir, "default_model = \"a\"\nresponses_retention_s = 0");
  Daemon d0(dir, cfg0, state);
  d0.wait_listening();
  CHECK_FALSE(state::Store(state).get_document("responses", stored_id));
  REQUIRE_MESSAGE(sdtest::wait_for([&] { return contains(cli("--config " + cfg0 + " status").out, "ready"); }, 15000),
                  d0.log());
  auto none = d0.call("POST", "/v1/responses", {}, R"({"model":"a-served","input":"hi"})");
  REQUIRE(none.status == 200);
  const std::string none_id = json::parse(none.body)["id"];
  CHECK(d0.call("POST", "/v1/responses", {},
                R"({"model":"a-served","input":"again","previous_response_id":")" + none_id + "\"}")
            .status == 404);
  ::kill(static_cast<pid_t>(d0.proc->pid()), SIGTERM);
  REQUIRE_MESSAGE(d0.proc->wait_exit(15s), d0.log());
  fs::remove_all(dir);
}

TEST_CASE("daemon and CLI share one state-directory rule; a unit whose StateDirectory differs is refused") {
  auto dir = sdtest::temp_dir("cli-statedir");
  auto cfg = write_config(dir, "");
  const std::string elsewhere = dir + "/elsewhere";

  // $SERVEDECK_STATE_DIR moves the daemon as it moves the CLI.
  {
    Daemon d(dir, cfg, elsewhere, {{"SERVEDECK_STATE_DIR", elsewhere}});
    d.wait_listening();
    CHECK_FALSE(fs::exists(dir + "/state/daemon.json"));
    auto st = sdtest::cli_cmd("SERVEDECK_STATE_DIR='" + elsewhere + "' " + SERVEDECK_CLI + " --config " + cfg +
                              " status 2>&1");
    CAPTURE(st.out);
    CHECK(st.rc == 0);
    CHECK(contains(st.out, "servedeck daemon: up"));
    ::kill(static_cast<pid_t>(d.proc->pid()), SIGTERM);
    REQUIRE_MESSAGE(d.proc->wait_exit(15s), d.log());
  }

  // Under a unit whose StateDirectory is not the config's state_dir, the CLI would look in the
  // wrong place: the daemon says so and does not start.
  auto r = sdtest::cli_cmd("STATE_DIRECTORY='" + elsewhere + "' " + std::string(SERVEDECK_CLI) + " --config " + cfg +
                           " serve 2>&1");
  CAPTURE(r.out);
  CHECK(r.rc == 2);
  CHECK(contains(r.out, "StateDirectory is " + elsewhere));
  CHECK(contains(r.out, "set state_dir = \"" + elsewhere + "\" in " + cfg));
  CHECK_FALSE(fs::exists(dir + "/state/daemon.json"));

  // A state directory this user cannot enter: the CLI says it cannot tell, not "down".
  if (::geteuid() != 0) {
    fs::create_directories(dir + "/locked");
    std::ofstream(dir + "/locked/daemon.json") << R"({"host":"127.0.0.1","port":1,"pid":1})";
    ::chmod((dir + "/locked").c_str(), 0);
    auto locked = cli("--state-dir " + dir + "/locked status");
    ::chmod((dir + "/locked").c_str(), 0700);
    CAPTURE(locked.out);
    CHECK(locked.rc == 2);
    CHECK(contains(locked.out, "cannot tell whether the daemon runs"));
    CHECK(contains(locked.out, "Permission denied"));
    CHECK_FALSE(contains(locked.out, "DOWN"));
  }
  fs::remove_all(dir);
}
