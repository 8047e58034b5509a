// fake_engine: an engine-like test program for the supervisor and gateway tests. It speaks enough
// of the OpenAI HTTP API (GET /health, GET /v1/models, POST /v1/completions, POST
// /v1/chat/completions with and without "stream") through common/http's Server, and misbehaves on
// request:
//
//   --port N / --host H / --served-name NAME    where to listen and which model id to answer
//   --slow-start-ms N        do not listen for N ms (a model load)
//   --log-progress           print "loading: shard i" lines every 100 ms during the slow start (G30)
//   --exit-during-start C    print an error and exit with code C before listening
//   --crash-mid-stream-after N   a stream sends N content chunks, then the process dies (_exit 1)
//   --exit-after-ready-ms N  exit (code 3) N ms after listening (liveness after ready)
//   --ignore-sigterm         SIGTERM is ignored (the group must be SIGKILLed)
//   --flood-on-sigterm       on SIGTERM, writes ~64 MB/s to stdout until SIGKILLed
//   --fork-grandchild MODE   fork a child that keeps running: MODE "session" (same group and
//                            session), "setpgid" (moves into its own group, same session) or
//                            "setsid" (forked after listening: leaves the session with setsid()
//                            and keeps the listening socket, so it holds the port)
//   --grandchild-pid-file P  write the grandchild's pid to P
//   --hold-shm PATH          create PATH (--hold-shm-bytes, default 1 MiB), mmap it shared, close the
//                            fd and keep the mapping for life
//   --health-ok-but-completions-fail   /health 200, every completion 500 (G26)
//   --completions-fail-utf8-edge       every completion 500 with a body whose byte 300 (where a
//                                      probe's excerpt ends) is inside a two-byte UTF-8 character
//   --completions-hang-after-ms N      N ms after listening, completions are accepted and never
//                                      answered (health stays 200): a wedged engine
//   --health-hang-after-ms N           N ms after listening, /health is never answered
//   --chunks N               content chunks per stream (default 5)
//   --stream-delay-ms N      delay between stream chunks (default 20)
//   --script-dir DIR         a completion whose last user message is "script:NAME" is answered
//                            with DIR/NAME.json (below), byte for byte
//   --request-log FILE       appends one JSON line per completion request ({"path","body"}, the
//                            body as parsed, or {"raw_bytes": n} when it is not JSON) and one per
//                            scripted answer when it ends ({"script","written","pieces",
//                            "client_gone","ms"})
//   --health-fail-file PATH  /health answers 503 while PATH exists (an engine still loading)
//
// A script: {"status": 200, "content_type": "text/event-stream", "chunked": true,
//            "pieces": [{"text": "...", "hex": "ff00", "repeat": N, "delay_ms": N}, ...],
//            "ending": "end" | "cut" | "hang"}
// Each piece is its text (or hex bytes) `repeat` times (default 1), written after `delay_ms`;
// "cut" closes the connection without the final chunk, "hang" keeps it open until the client
// goes (at most 60 s). "chunked": false sends the joined pieces as one Content-Length body after
// all the delays. Writes wait while more than 2 MiB are queued for the client (like an engine);
// delays end early when the client goes.
//
// Prints one line per event to stdout (the supervisor's launch log).
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cctype>
#include <chrono>
#include <mutex>
#include <vector>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "common/http/server.hpp"

namespace {

struct Options {
  std::string host = "127.0.0.1";
  int port = 0;
  std::string served_name = "fake";
  int slow_start_ms = 0;
  bool log_progress = false;
  int exit_during_start = -1;
  int crash_mid_stream_after = -1;
  int exit_after_ready_ms = -1;
  bool ignore_sigterm = false;
  bool flood_on_sigterm = false;
  std::string fork_grandchild;
  std::string grandchild_pid_file;
  std::string hold_shm;
  long hold_shm_bytes = 1 << 20;
  bool completions_fail = false;
  bool completions_fail_utf8_edge = false;
  int completions_hang_after_ms = -1;
  int health_hang_after_ms = -1;
  int chunks = 5;
  int stream_delay_ms = 20;
  std::string script_dir;
  std::string request_log;
  std::string health_fail_file;
};

void say(const std::string& s) {
  std::printf("fake_engine[%d]: %s\n", static_cast<int>(getpid()), s.c_str());
  std::fflush(stdout);
}

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr, "fake_engine: %s\n", why.c_str());
  std::exit(2);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(a + " needs a value");
      return argv[++i];
    };
    if (a == "--port") o.port = std::atoi(value().c_str());
    else if (a == "--host") o.host = value();
    else if (a == "--served-name") o.served_name = value();
    else if (a == "--slow-start-ms") o.slow_start_ms = std::atoi(value().c_str());
    else if (a == "--log-progress") o.log_progress = true;
    else if (a == "--exit-during-start") o.exit_during_start = std::atoi(value().c_str());
    else if (a == "--crash-mid-stream-after") o.crash_mid_stream_after = std::atoi(value().c_str());
    else if (a == "--exit-after-ready-ms") o.exit_after_ready_ms = std::atoi(value().c_str());
    else if (a == "--ignore-sigterm") o.ignore_sigterm = true;
    else if (a == "--flood-on-sigterm") o.flood_on_sigterm = true;
    else if (a == "--fork-grandchild") o.fork_grandchild = value();
    else if (a == "--grandchild-pid-file") o.grandchild_pid_file = value();
    else if (a == "--hold-shm") o.hold_shm = value();
    else if (a == "--hold-shm-bytes") o.hold_shm_bytes = std::atol(value().c_str());
    else if (a == "--health-ok-but-completions-fail") o.completions_fail = true;
    else if (a == "--completions-fail-utf8-edge") o.completions_fail_utf8_edge = true;
    else if (a == "--completions-hang-after-ms") o.completions_hang_after_ms = std::atoi(value().c_str());
    else if (a == "--health-hang-after-ms") o.health_hang_after_ms = std::atoi(value().c_str());
    else if (a == "--chunks") o.chunks = std::atoi(value().c_str());
    else if (a == "--stream-delay-ms") o.stream_delay_ms = std::atoi(value().c_str());
    else if (a == "--script-dir") o.script_dir = value();
    else if (a == "--request-log") o.request_log = value();
    else if (a == "--health-fail-file") o.health_fail_file = value();
    else usage("unknown option " + a);
  }
  if (o.fork_grandchild != "" && o.fork_grandchild != "session" && o.fork_grandchild != "setpgid" &&
      o.fork_grandchild != "setsid")
    usage("--fork-grandchild expects session, setpgid or setsid, got " + o.fork_grandchild);
  return o;
}

void fork_grandchild(const Options& o) {
  pid_t pid = fork();
  if (pid < 0) usage(std::string("fork: ") + std::strerror(errno));
  if (pid == 0) {
    // Only async-signal-safe calls: in setsid mode the parent already runs server threads.
    if (o.fork_grandchild == "setpgid") setpgid(0, 0);
    if (o.fork_grandchild == "setsid") setsid();  // a new session: out of the engine's session and group
    for (;;) pause();  // keeps running (and, in setsid mode, holding the listening socket)
  }
  if (o.fork_grandchild == "setpgid") setpgid(pid, pid);  // also from the parent: no race with the check
  if (!o.grandchild_pid_file.empty()) {
    std::string tmp = o.grandchild_pid_file + ".tmp";
    std::ofstream(tmp) << pid << "\n";
    std::rename(tmp.c_str(), o.grandchild_pid_file.c_str());
  }
  say("forked grandchild " + std::to_string(pid) + " (" + o.fork_grandchild + ")");
}

void hold_shm(const Options& o) {
  int fd = ::open(o.hold_shm.c_str(), O_RDWR | O_CREAT, 0600);
  if (fd < 0) usage("--hold-shm " + o.hold_shm + ": " + std::strerror(errno));
  if (ftruncate(fd, o.hold_shm_bytes) != 0) usage(std::string("ftruncate: ") + std::strerror(errno));
  void* p = mmap(nullptr, static_cast<size_t>(o.hold_shm_bytes), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) usage(std::string("mmap: ") + std::strerror(errno));
  std::memset(p, 1, static_cast<size_t>(o.hold_shm_bytes));  // the pages exist: st_blocks > 0
  ::close(fd);  // only the mapping holds it now
  say("holding " + o.hold_shm + " mapped (" + std::to_string(o.hold_shm_bytes) + " bytes)");
}

nlohmann::json completion_body(const Options& o, bool chat) {
  nlohmann::json choice = {{"index", 0}, {"finish_reason", "length"}};
  if (chat) choice["message"] = {{"role", "assistant"}, {"content", "hello"}};
  else choice["text"] = " hello";
  return {{"id", chat ? "chatcmpl-fake" : "cmpl-fake"},
          {"object", chat ? "chat.completion" : "text_completion"},
          {"model", o.served_name},
          {"choices", nlohmann::json::array({choice})},
          {"usage", {{"prompt_tokens", 1}, {"completion_tokens", 1}, {"total_tokens", 2}}}};
}

void stream(const Options& o, bool chat, const std::shared_ptr<servedeck::http::Responder>& res) {
  if (!res->start_stream(200)) return;
  for (int i = 0; i < o.chunks; ++i) {
    if (o.crash_mid_stream_after >= 0 && i == o.crash_mid_stream_after) {
      say("crashing mid-stream after " + std::to_string(i) + " chunks");
      _exit(1);
    }
    nlohmann::json choice = {{"index", 0}, {"finish_reason", nullptr}};
    if (chat) choice["delta"] = {{"content", "tok" + std::to_string(i) + " "}};
    else choice["text"] = "tok" + std::to_string(i) + " ";
    nlohmann::json chunk = {{"id", "chatcmpl-fake"},
                            {"object", chat ? "chat.completion.chunk" : "text_completion"},
                            {"model", o.served_name},
                            {"choices", nlohmann::json::array({choice})}};
    if (!res->write("data: " + chunk.dump() + "\n\n")) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(o.stream_delay_ms));
  }
  nlohmann::json last = {{"id", "chatcmpl-fake"},
                         {"object", chat ? "chat.completion.chunk" : "text_completion"},
                         {"model", o.served_name},
                         {"choices", nlohmann::json::array({{{"index", 0},
                                                             {"finish_reason", "stop"},
                                                             {chat ? "delta" : "text",
                                                              chat ? nlohmann::json::object() : nlohmann::json("")}}})}};
  res->write("data: " + last.dump() + "\n\n");
  res->write("data: [DONE]\n\n");
  res->end();
}

std::mutex g_log_mu;

void log_request(const Options& o, const nlohmann::json& line) {
  if (o.request_log.empty()) return;
  std::lock_guard lk(g_log_mu);
  std::ofstream(o.request_log, std::ios::app)
      << line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
}

/// "NAME" when the last user message is the string "script:NAME"; "" otherwise.
std::string script_name(const nlohmann::json& body) {
  if (!body.is_object() || !body.contains("messages") || !body["messages"].is_array()) return "";
  std::string name;
  for (const auto& m : body["messages"]) {
    if (!m.is_object() || m.value("role", "") != "user") continue;
    name.clear();
    if (m.contains("content") && m["content"].is_string()) {
      const std::string c = m["content"].get<std::string>();
      if (c.rfind("script:", 0) == 0) name = c.substr(7);
    }
  }
  for (char c : name)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '-') return "";
  return name;
}

std::string piece_bytes(const nlohmann::json& p) {
  std::string unit;
  if (p.contains("text")) unit = p["text"].get<std::string>();
  if (p.contains("hex")) {
    const std::string h = p["hex"].get<std::string>();
    for (std::size_t i = 0; i + 1 < h.size(); i += 2) unit.push_back(static_cast<char>(std::stoi(h.substr(i, 2), nullptr, 16)));
  }
  std::string out;
  const long repeat = p.value("repeat", 1L);
  out.reserve(unit.size() * static_cast<std::size_t>(repeat));
  for (long i = 0; i < repeat; ++i) out += unit;
  return out;
}

/// Sleeps `ms`, returning early (false) when the client went away.
bool wait_ms(const std::shared_ptr<servedeck::http::Responder>& res, int ms) {
  auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  while (std::chrono::steady_clock::now() < until) {
    if (res->client_gone()) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return !res->client_gone();
}

void play_script(const Options& o, const std::string& name, const std::shared_ptr<servedeck::http::Responder>& res) {
  std::ifstream f(o.script_dir + "/" + name + ".json");
  std::stringstream text;
  text << f.rdbuf();
  auto script = nlohmann::json::parse(text.str(), nullptr, false);
  if (!f || script.is_discarded() || !script.is_object()) {
    servedeck::http::send_error(*res, 500, "no readable script " + name, "server_error", "no_script", true);
    return;
  }
  const auto t0 = std::chrono::steady_clock::now();
  const auto& pieces = script.value("pieces", nlohmann::json::array());
  const int status = script.value("status", 200);
  const std::string type = script.value("content_type", std::string("text/event-stream"));
  int written = 0;
  auto report = [&] {
    log_request(o, {{"script", name},
                    {"written", written},
                    {"pieces", pieces.size()},
                    {"client_gone", res->client_gone()},
                    {"ms", std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count()}});
  };
  if (!script.value("chunked", true)) {
    std::string body;
    for (const auto& p : pieces) {
      wait_ms(res, p.value("delay_ms", 0));
      body += piece_bytes(p);
      ++written;
    }
    res->send(status, type, body);
    report();
    return;
  }
  if (!res->start_stream(status, type)) return report();
  for (const auto& p : pieces) {
    if (!wait_ms(res, p.value("delay_ms", 0))) return report();
    const std::string bytes = piece_bytes(p);
    for (std::size_t at = 0; at < bytes.size(); at += 256 * 1024) {
      while (res->queued_bytes() > 2 * 1024 * 1024 && !res->client_gone())
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      if (!res->write(std::string_view(bytes).substr(at, 256 * 1024))) return report();
    }
    ++written;
  }
  const std::string ending = script.value("ending", std::string("end"));
  if (ending == "end") res->end();
  else if (ending == "hang") wait_ms(res, 60000);
  // "cut": dropping the responder mid-stream closes the connection without the final chunk.
  report();
}

}  // namespace

int main(int argc, char** argv) {
  Options o = parse(argc, argv);
  signal(SIGPIPE, SIG_IGN);
  if (o.ignore_sigterm) {
    signal(SIGTERM, SIG_IGN);
    say("ignoring SIGTERM");
  }
  say("starting: served_name " + o.served_name + ", port " + std::to_string(o.port));
  if (!o.hold_shm.empty()) hold_shm(o);
  if (!o.fork_grandchild.empty() && o.fork_grandchild != "setsid") fork_grandchild(o);  // before any thread exists
  if (o.flood_on_sigterm) {
    // Blocked before the server's threads exist, so only this one takes it.
    sigset_t term;
    sigemptyset(&term);
    sigaddset(&term, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &term, nullptr);
    std::thread([term] {
      int sig = 0;
      sigwait(&term, &sig);
      const std::string line(64 * 1024 - 1, 'x');
      const std::string chunk = line + "\n";
      for (;;)
        if (::write(1, chunk.data(), chunk.size()) >= 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }).detach();
    say("flooding stdout on SIGTERM");
  }

  auto t0 = std::chrono::steady_clock::now();
  int shard = 0;
  while (std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(o.slow_start_ms)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    if (o.log_progress) say("loading: shard " + std::to_string(++shard));
  }
  if (o.exit_during_start >= 0) {
    say("error: CUDA out of memory while loading weights (simulated); exiting with " +
        std::to_string(o.exit_during_start));
    return o.exit_during_start;
  }

  servedeck::http::ServerOptions so;
  so.host = o.host;
  so.port = o.port;
  so.threads = 2;
  so.blocking_threads = 8;
  servedeck::http::Server* server_ptr = nullptr;
  std::atomic<int64_t> listening_ms{0};
  auto after = [&listening_ms](int ms) {
    return ms >= 0 && listening_ms.load() > 0 &&
           std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch())
                       .count() - listening_ms.load() >= ms;
  };
  // Requests a wedged engine never answers: their responders are kept here, unanswered, for life.
  std::mutex wedged_mu;
  std::vector<std::shared_ptr<servedeck::http::Responder>> wedged;
  servedeck::http::Server server(so, [&o, &server_ptr, &after, &wedged_mu, &wedged](
                                         servedeck::http::Request req, std::shared_ptr<servedeck::http::Responder> res) {
    auto hang = [&] {
      std::lock_guard lk(wedged_mu);
      wedged.push_back(res);
    };
    if (req.method == "GET" && req.path == "/health") {
      if (after(o.health_hang_after_ms)) return hang();
      if (!o.health_fail_file.empty() && access(o.health_fail_file.c_str(), F_OK) == 0)
        servedeck::http::send_error(*res, 503, "loading (simulated)", "server_error", "loading", true);
      else
        res->send(200, "application/json", "{}");
      return;
    }
    if (req.method == "GET" && req.path == "/v1/models") {
      res->send(200, "application/json",
                nlohmann::json{{"object", "list"},
                               {"data", {{{"id", o.served_name}, {"object", "model"}}}}}.dump());
      return;
    }
    bool chat = req.path == "/v1/chat/completions";
    if (req.method == "POST" && (chat || req.path == "/v1/completions")) {
      if (after(o.completions_hang_after_ms)) return hang();
      if (o.completions_fail_utf8_edge) {
        // 299 ASCII bytes, then "é" (C3 A9) at bytes 299-300: a 300-byte cut splits it.
        std::string body = std::string(299, 'x') + "\xC3\xA9 CUDA error: out of memory (simulated)";
        res->send(500, "text/plain", body);
        return;
      }
      if (o.completions_fail) {
        servedeck::http::send_error(*res, 500, "CUDA error: out of memory (simulated)", "server_error",
                                    "internal_error", true);
        return;
      }
      auto body = nlohmann::json::parse(req.body, nullptr, false);
      log_request(o, body.is_discarded() ? nlohmann::json{{"path", req.path}, {"raw_bytes", req.body.size()}}
                                         : nlohmann::json{{"path", req.path}, {"body", body}});
      if (const std::string name = script_name(body); !name.empty() && !o.script_dir.empty()) {
        if (!server_ptr->post_blocking([&o, name, res] { play_script(o, name, res); }))
          servedeck::http::send_error(*res, 503, "busy", "server_error", "busy", true);
        return;
      }
      if (body.is_discarded() || !body.is_object()) {
        servedeck::http::send_error(*res, 400, "body is not a JSON object", "invalid_request_error",
                                    "invalid_json", true);
        return;
      }
      if (body.value("stream", false)) {
        if (!server_ptr->post_blocking([&o, chat, res] { stream(o, chat, res); }))
          servedeck::http::send_error(*res, 503, "busy", "server_error", "busy", true);
        return;
      }
      res->send(200, "application/json", completion_body(o, chat).dump());
      return;
    }
    servedeck::http::send_error(*res, 404, "no route " + req.method + " " + req.path, "invalid_request_error",
                                "not_found", true);
  });
  server_ptr = &server;
  server.start();
  listening_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                     std::chrono::steady_clock::now().time_since_epoch()).count();
  say("listening on " + o.host + ":" + std::to_string(server.port()));
  if (o.fork_grandchild == "setsid") fork_grandchild(o);  // inherits the listening socket
  if (o.exit_after_ready_ms >= 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(o.exit_after_ready_ms));
    say("exiting on purpose (--exit-after-ready-ms)");
    _exit(3);
  }
  for (;;) pause();
}
